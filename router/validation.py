"""Range checks on every public input field; failures name the field and become INVALID_ARGUMENT."""
import json
import math

from sluice.core.errors import InvalidArgument
from sluice.core.grammar import grammar_error, grammar_for
from sluice.core.logprobs import MAX_LOGPROBS
from sluice.core.sampling_params import SamplingParams

MAX_N = 16
MAX_STOP_TOKEN_IDS = 64
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_LOGIT_BIAS = 100.0
MAX_PENALTY = 2.0  # presence and frequency, as OpenAI's API bounds them
MAX_CONSTRAINT_CHARS = 64 * 1024
MAX_BAD_WORDS = 64
MAX_BAD_WORD_TOKENS = 16


def validate_prompt(token_ids: list[int], vocab_size: int, max_model_len: int, field: str) -> None:
    if not token_ids:
        raise InvalidArgument(field, "the prompt is empty")
    if len(token_ids) >= max_model_len:
        raise InvalidArgument(field, f"the prompt has {len(token_ids)} tokens; the model takes at most "
                                     f"{max_model_len - 1} to leave room for one generated token")
    _check_token_ids(field, token_ids, vocab_size)


def validate_chat_roles(roles: list[str]) -> None:
    """An empty role is refused here; which other roles a chat may use is the model's chat template's call."""
    empty = next((index for index, role in enumerate(roles) if not role.strip()), None)
    if empty is not None:
        raise InvalidArgument(f"chat.messages[{empty}].role", "must name a role (system, user, assistant, ...)")


def truncate_prompt(token_ids: list[int], keep_last: int | None) -> list[int]:
    """vLLM's truncate_prompt_tokens: the prompt's last `keep_last` tokens (all of them when None)."""
    if keep_last is None:
        return token_ids
    if keep_last < 1:
        raise InvalidArgument("sampling.truncate_prompt_tokens", f"must be >= 1, got {keep_last}")
    return token_ids[-keep_last:]


def validate_sampling(params: SamplingParams, num_prompt_tokens: int, max_model_len: int, vocab_size: int) -> None:
    _check_lengths(params, num_prompt_tokens, max_model_len)
    _check_distribution(params)
    _check_penalties(params, vocab_size)
    _check_token_ids("sampling.allowed_token_ids", params.allowed_token_ids, vocab_size)
    _check_stops(params, vocab_size)
    _check_bad_words(params, vocab_size)
    _check_counts(params)
    _check_constraint(params)


def _check_lengths(params: SamplingParams, num_prompt_tokens: int, max_model_len: int) -> None:
    if params.max_tokens < 1:
        raise InvalidArgument("sampling.max_tokens", f"must be >= 1, got {params.max_tokens}")
    if num_prompt_tokens + params.max_tokens > max_model_len:
        raise InvalidArgument("sampling.max_tokens", f"prompt ({num_prompt_tokens} tokens) + max_tokens "
                                                     f"({params.max_tokens}) exceeds the model length {max_model_len}")
    if params.min_tokens > params.max_tokens:
        raise InvalidArgument("sampling.min_tokens", f"{params.min_tokens} exceeds max_tokens {params.max_tokens}")


def _check_distribution(params: SamplingParams) -> None:
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise InvalidArgument("sampling.temperature", f"must be a finite number >= 0, got {params.temperature}")
    if math.isnan(params.top_p) or not 0 < params.top_p <= 1:
        raise InvalidArgument("sampling.top_p", f"must be in (0, 1], got {params.top_p}")
    if params.top_k < -1 or params.top_k == 0:
        raise InvalidArgument("sampling.top_k", f"must be -1 (disabled) or >= 1, got {params.top_k}")
    if math.isnan(params.min_p) or not 0 <= params.min_p <= 1:
        raise InvalidArgument("sampling.min_p", f"must be in [0, 1], got {params.min_p}")


def _check_penalties(params: SamplingParams, vocab_size: int) -> None:
    for field, value in (("presence_penalty", params.presence_penalty),
                         ("frequency_penalty", params.frequency_penalty)):
        if math.isnan(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
            raise InvalidArgument(f"sampling.{field}", f"must be in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value}")
    if not math.isfinite(params.repetition_penalty) or params.repetition_penalty <= 0:
        raise InvalidArgument("sampling.repetition_penalty",
                              f"must be a finite number > 0, got {params.repetition_penalty}")
    if len(params.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidArgument("sampling.logit_bias", f"at most {MAX_LOGIT_BIAS_ENTRIES} entries")
    _check_token_ids("sampling.logit_bias", list(params.logit_bias), vocab_size)
    bad = next((v for v in params.logit_bias.values() if math.isnan(v) or abs(v) > MAX_LOGIT_BIAS), None)
    if bad is not None:
        raise InvalidArgument("sampling.logit_bias", f"biases must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], "
                                                     f"got {bad}")


def _check_stops(params: SamplingParams, vocab_size: int) -> None:
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidArgument("sampling.stop_token_ids", f"at most {MAX_STOP_TOKEN_IDS} ids")
    _check_token_ids("sampling.stop_token_ids", params.stop_token_ids, vocab_size)
    if len(params.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument("sampling.stop", f"at most {MAX_STOP_STRINGS} stop strings")
    if any(not 0 < len(stop) <= MAX_STOP_STRING_CHARS for stop in params.stop):
        raise InvalidArgument("sampling.stop", f"stop strings must have 1 to {MAX_STOP_STRING_CHARS} characters")


def _check_bad_words(params: SamplingParams, vocab_size: int) -> None:
    if len(params.bad_words) > MAX_BAD_WORDS:
        raise InvalidArgument("sampling.bad_words", f"at most {MAX_BAD_WORDS} words")
    if any(not word.strip() or len(word) > MAX_STOP_STRING_CHARS for word in params.bad_words):
        raise InvalidArgument("sampling.bad_words", f"words must have 1 to {MAX_STOP_STRING_CHARS} characters, "
                                                    "not all of them spaces")
    check_bad_words_token_ids("sampling.bad_words_token_ids", params.bad_words_token_ids, vocab_size)


def check_bad_words_token_ids(field: str, sequences: list[list[int]], vocab_size: int) -> None:
    if len(sequences) > 2 * MAX_BAD_WORDS:
        raise InvalidArgument(field, f"at most {2 * MAX_BAD_WORDS} sequences")
    for sequence in sequences:
        if not 1 <= len(sequence) <= MAX_BAD_WORD_TOKENS:
            raise InvalidArgument(field, f"a sequence has {len(sequence)} tokens; 1 to {MAX_BAD_WORD_TOKENS} allowed")
        _check_token_ids(field, sequence, vocab_size)


def _check_counts(params: SamplingParams) -> None:
    if not 1 <= params.n <= MAX_N:
        raise InvalidArgument("sampling.n", f"must be in [1, {MAX_N}], got {params.n}")
    for field, value in (("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)):
        if value is not None and value > MAX_LOGPROBS:
            raise InvalidArgument(f"sampling.{field}", f"at most {MAX_LOGPROBS} alternatives, got {value}")


def _check_constraint(params: SamplingParams) -> None:
    name = params.constraint
    if name is None:
        return
    field = f"sampling.{name}"
    if params.min_tokens:
        raise InvalidArgument(field, "structured output cannot be combined with min_tokens")
    if params.allowed_token_ids:
        raise InvalidArgument(field, "structured output cannot be combined with allowed_token_ids")
    if params.bad_words or params.bad_words_token_ids:
        raise InvalidArgument(field, "structured output cannot be combined with bad words")
    spec = getattr(params, name)
    if len(json.dumps(spec)) > MAX_CONSTRAINT_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_CONSTRAINT_CHARS} characters")
    if name == "choice" and not spec:
        raise InvalidArgument(field, "give at least one choice")
    if name == "json_schema":
        try:
            schema = json.loads(spec)
        except json.JSONDecodeError as error:
            raise InvalidArgument(field, f"not valid JSON: {error}") from error
        if not isinstance(schema, dict | bool):
            raise InvalidArgument(field, "a JSON schema is an object or a boolean")
        if schema is False:
            raise InvalidArgument(field, "the schema false admits no value")
    try:
        error = grammar_error(grammar_for(params))
    except ValueError as unreadable:
        raise InvalidArgument(field, f"llguidance cannot read it: {unreadable}") from unreadable
    if error is not None:
        raise InvalidArgument(field, f"does not compile: {error.strip()}")


def _check_token_ids(field: str, token_ids: list[int], vocab_size: int) -> None:
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidArgument(field, f"token id {bad} is outside the vocabulary [0, {vocab_size})")
