from dataclasses import replace

from sluice.sampling_params import SamplingParams
from sluice.v1 import generation_pb2 as pb

_OPTIONAL_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "min_tokens", "ignore_eos")


def sampling_params_from_pb(message: pb.SamplingParams, defaults: SamplingParams | None = None) -> SamplingParams:
    values = {name: getattr(message, name) for name in _OPTIONAL_FIELDS if message.HasField(name)}
    return replace(defaults or SamplingParams(), **values, stop_token_ids=list(message.stop_token_ids))


def sampling_params_to_pb(params: SamplingParams) -> pb.SamplingParams:
    values = {name: getattr(params, name) for name in _OPTIONAL_FIELDS if getattr(params, name) is not None}
    return pb.SamplingParams(**values, stop_token_ids=params.stop_token_ids)

