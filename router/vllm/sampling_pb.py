"""vLLM's engine protocol (smg-grpc-proto's vllm.grpc.engine) to the domain's SamplingParams, each field with the
native API's meaning, to be checked by the same checks. Its scalars are plain proto3 fields, where 0 and unset look
alike: smg fills top_p, repetition_penalty and n with 1 when its client leaves them out, so a 0 there is the client's
own and is refused as the native API refuses it; top_k 0 is off, as in vLLM (the field cannot carry -1). An unset
temperature is 1 and an unset max_tokens fills the context. skip_special_tokens and spaces_between_special_tokens
shape the gateway's own detokenization, and grammar_from_first_token asks for what Sluice always does (a constraint
holds from the first generated token): none of them changes the generation."""
import json
from dataclasses import replace

from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from sluice.core.errors import InvalidArgument
from sluice.core.sampling_params import SamplingParams

_ANY_JSON_OBJECT = json.dumps({"type": "object"})
_UNSUPPORTED_CONSTRAINTS = ("structural_tag",)


def sampling_params_from_vllm_pb(message: vllm.SamplingParams, defaults: SamplingParams) -> SamplingParams:
    values = {
        "temperature": message.temperature if message.HasField("temperature") else defaults.temperature,
        "top_p": message.top_p,
        "top_k": message.top_k or -1,
        "min_p": message.min_p,
        "presence_penalty": message.presence_penalty,
        "frequency_penalty": message.frequency_penalty,
        "repetition_penalty": message.repetition_penalty,
        "min_tokens": message.min_tokens,
        "ignore_eos": message.ignore_eos,
        "n": message.n,
        "include_stop_str_in_output": message.include_stop_str_in_output,
        "stop": list(message.stop),
        "stop_token_ids": list(message.stop_token_ids),
        "logit_bias": dict(message.logit_bias),
        **_constraint(message),
    }
    if message.HasField("max_tokens"):
        values["max_tokens"] = message.max_tokens
    if message.HasField("seed"):
        values["seed"] = _non_negative("seed", message.seed)
    for name in ("logprobs", "prompt_logprobs"):
        if message.HasField(name):
            values[name] = _non_negative(name, getattr(message, name))
    return replace(defaults, **values)


def truncate_prompt_tokens(message: vllm.SamplingParams, max_model_len: int) -> int | None:
    """How many of the prompt's last tokens to keep: None for all; vLLM's -1 (the model's length) keeps room for one
    generated token."""
    if not message.HasField("truncate_prompt_tokens"):
        return None
    return max_model_len - 1 if message.truncate_prompt_tokens == -1 else message.truncate_prompt_tokens


def _constraint(message: vllm.SamplingParams) -> dict:
    name = message.WhichOneof("constraint")
    if name is None:
        return {}
    if name in _UNSUPPORTED_CONSTRAINTS:
        raise InvalidArgument(f"sampling_params.{name}", "not supported: use json_schema, regex, grammar or choice")
    if name == "json_object":
        return {"json_schema": _ANY_JSON_OBJECT} if message.json_object else {}
    if name == "choice":
        return {"choice": list(message.choice.choices)}
    return {name: getattr(message, name)}


def _non_negative(name: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(f"sampling_params.{name}", f"must be >= 0, got {value}")
    return value
