"""Range checks on every public input field; failures name the field and become INVALID_ARGUMENT."""
import math

from sluice.errors import InvalidArgument
from sluice.sampling_params import SamplingParams

MAX_STOP_TOKEN_IDS = 64


def validate_prompt(token_ids: list[int], vocab_size: int, max_model_len: int, field: str) -> None:
    if not token_ids:
        raise InvalidArgument(field, "the prompt is empty")
    if len(token_ids) >= max_model_len:
        raise InvalidArgument(field, f"the prompt has {len(token_ids)} tokens; the model takes at most "
                                     f"{max_model_len - 1} to leave room for one generated token")
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidArgument(field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def validate_sampling(params: SamplingParams, num_prompt_tokens: int, max_model_len: int, vocab_size: int) -> None:
    if params.max_tokens < 1:
        raise InvalidArgument("sampling.max_tokens", f"must be >= 1, got {params.max_tokens}")
    if num_prompt_tokens + params.max_tokens > max_model_len:
        raise InvalidArgument("sampling.max_tokens", f"prompt ({num_prompt_tokens} tokens) + max_tokens "
                                                     f"({params.max_tokens}) exceeds the model length {max_model_len}")
    if math.isnan(params.temperature) or params.temperature < 0:
        raise InvalidArgument("sampling.temperature", f"must be a number >= 0, got {params.temperature}")
    if math.isnan(params.top_p) or not 0 < params.top_p <= 1:
        raise InvalidArgument("sampling.top_p", f"must be in (0, 1], got {params.top_p}")
    if params.top_k < -1 or params.top_k == 0:
        raise InvalidArgument("sampling.top_k", f"must be -1 (disabled) or >= 1, got {params.top_k}")
    if math.isnan(params.min_p) or not 0 <= params.min_p <= 1:
        raise InvalidArgument("sampling.min_p", f"must be in [0, 1], got {params.min_p}")
    if params.min_tokens > params.max_tokens:
        raise InvalidArgument("sampling.min_tokens", f"{params.min_tokens} exceeds max_tokens {params.max_tokens}")
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument("sampling.stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids")
    bad = next((t for t in params.stop_token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidArgument("sampling.stop_token_ids", f"token id {bad} is outside the vocabulary")
