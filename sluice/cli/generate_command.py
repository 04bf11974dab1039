"""`sluice generate`: one request to a running router, with every generation control as a flag."""
import argparse
import json
import sys
from pathlib import Path


def add_generate_command(commands, default_address: str, default_auth_token: str | None) -> None:
    command = commands.add_parser("generate", help="stream one generation from a running router")
    command.add_argument("prompt")
    command.add_argument("--address", default=default_address)
    command.add_argument("--auth-token", default=default_auth_token, help="bearer token (default: $SLUICE_AUTH_TOKEN)")
    command.add_argument("--tls-ca", type=Path, help="PEM root certificates of a TLS router")
    command.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    command.add_argument("--image", dest="images", action="append", default=[], type=Path, metavar="FILE",
                         help="an image before the prompt in the user's message (repeatable; implies --chat)")
    command.add_argument("--json", action="store_true", help="end with one JSON object per sample")
    command.add_argument("--max-tokens", type=int, default=256)
    command.add_argument("--min-tokens", type=int)
    command.add_argument("--temperature", type=float, default=0.0)
    command.add_argument("--top-p", type=float)
    command.add_argument("--top-k", type=int)
    command.add_argument("--min-p", type=float)
    command.add_argument("--seed", type=int)
    command.add_argument("--n", type=int, help="independent samples")
    command.add_argument("--presence-penalty", type=float)
    command.add_argument("--frequency-penalty", type=float)
    command.add_argument("--repetition-penalty", type=float)
    command.add_argument("--logit-bias", action="append", default=[], metavar="TOKEN_ID=BIAS", type=_logit_bias)
    command.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    command.add_argument("--stop-token-id", dest="stop_token_ids", action="append", default=[], type=int)
    command.add_argument("--allowed-token-id", dest="allowed_token_ids", action="append", default=[], type=int,
                         help="only these tokens may be generated (repeatable)")
    command.add_argument("--truncate-prompt-tokens", type=int, help="keep only the prompt's last K tokens")
    command.add_argument("--bad-word", dest="bad_words", action="append", default=[],
                         help="a word never to generate, alone or after a space (repeatable)")
    command.add_argument("--include-stop-str-in-output", action="store_true", default=None)
    command.add_argument("--ignore-eos", action="store_true", default=None)
    command.add_argument("--logprobs", type=int, help="logprob of each token and this many alternatives")
    command.add_argument("--prompt-logprobs", type=int)
    constraint = command.add_mutually_exclusive_group()
    constraint.add_argument("--json-schema", help="a JSON schema, or @FILE")
    constraint.add_argument("--regex")
    constraint.add_argument("--choice", action="append", help="one allowed output (repeatable)")
    constraint.add_argument("--grammar", help="a Lark grammar, or @FILE")
    command.set_defaults(run=_generate)


_SAMPLING_FLAGS = ("max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "n",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "stop", "stop_token_ids",
                   "include_stop_str_in_output", "ignore_eos", "logprobs", "prompt_logprobs", "regex", "choice",
                   "allowed_token_ids", "truncate_prompt_tokens", "bad_words")


def _logit_bias(text: str) -> tuple[int, float]:
    token_id, _, bias = text.partition("=")
    try:
        return int(token_id), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID=BIAS, got {text!r}") from None


def _text_or_file(value: str | None) -> str | None:
    return Path(value[1:]).read_text() if value is not None and value.startswith("@") else value


def _generate(args) -> None:
    import grpc

    from sluice.client import SluiceClient, chat_request, text_request

    sampling = {name: getattr(args, name) for name in _SAMPLING_FLAGS if getattr(args, name) not in (None, [])}
    sampling["logit_bias"] = dict(args.logit_bias)
    for name in ("json_schema", "grammar"):
        if getattr(args, name) is not None:
            sampling[name] = _text_or_file(getattr(args, name))
    if args.chat or args.images:
        request = chat_request(args.prompt, args.images, **sampling)
    else:
        request = text_request(args.prompt, **sampling)
    streaming = (args.n or 1) == 1
    root_certificates = args.tls_ca.read_bytes() if args.tls_ca is not None else None
    with SluiceClient(args.address, args.auth_token, root_certificates) as client:
        try:
            samples = client.generate_samples(
                request, on_text=(lambda index, text: print(text, end="", flush=True)) if streaming else None)
        except grpc.RpcError as error:
            sys.exit(f"\nerror: {error.code().name}: {error.details()}")
    if streaming:
        print()
    else:
        for sample in samples:
            print(f"--- sample {sample.index} ({sample.finish_reason})\n{sample.text}")
    if args.json:
        for sample in samples:
            print(json.dumps(sample.to_json()))
