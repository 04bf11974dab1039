"""SamplingParams to and from sluice.v1's message; an unset field keeps the default."""
from dataclasses import replace

from sluice.core.sampling_params import SamplingParams
from sluice.v1 import generation_pb2 as pb

_OPTIONAL_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "min_tokens", "ignore_eos", "n",
                    "presence_penalty", "frequency_penalty", "repetition_penalty", "include_stop_str_in_output",
                    "logprobs", "prompt_logprobs", "truncate_prompt_tokens")
_STRING_CONSTRAINTS = ("json_schema", "regex", "grammar")


def sampling_params_from_pb(message: pb.SamplingParams, defaults: SamplingParams | None = None) -> SamplingParams:
    values = {name: getattr(message, name) for name in _OPTIONAL_FIELDS if message.HasField(name)}
    constraint = message.WhichOneof("constraint")
    if constraint == "choice":
        values["choice"] = list(message.choice.values)
    elif constraint is not None:
        values[constraint] = getattr(message, constraint)
    return replace(defaults or SamplingParams(), **values, stop_token_ids=list(message.stop_token_ids),
                   logit_bias=dict(message.logit_bias), stop=list(message.stop),
                   allowed_token_ids=list(message.allowed_token_ids), bad_words=list(message.bad_words),
                   bad_words_token_ids=[list(sequence.ids) for sequence in message.bad_words_token_ids])


def sampling_params_to_pb(params: SamplingParams) -> pb.SamplingParams:
    values = {name: getattr(params, name) for name in (*_OPTIONAL_FIELDS, *_STRING_CONSTRAINTS)
              if getattr(params, name) is not None}
    if params.choice is not None:
        values["choice"] = pb.Choice(values=params.choice)
    return pb.SamplingParams(**values, stop_token_ids=params.stop_token_ids, logit_bias=params.logit_bias,
                             stop=params.stop, allowed_token_ids=params.allowed_token_ids, bad_words=params.bad_words,
                             bad_words_token_ids=[pb.TokenIds(ids=ids) for ids in params.bad_words_token_ids])
