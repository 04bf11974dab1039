"""The checks every public API runs on a generation before it is submitted (router/validation.py's ranges, against
the served model and the tokenizer), whichever protocol it came in."""
from sluice.core.errors import InvalidArgument
from sluice.core.sampling_params import SamplingParams
from sluice.router.validation import check_bad_words_token_ids, truncate_prompt, validate_prompt, validate_sampling


class RequestChecks:
    def __init__(self, tokenizer, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    def prompt(self, token_ids: list[int], truncate_to: int | None, field: str, has_images: bool = False) -> list[int]:
        """The prompt after truncation (its last `truncate_to` tokens), checked. Truncation would move the images'
        placeholders: a prompt with images is never cut."""
        if has_images and truncate_to is not None and truncate_to < len(token_ids):
            raise InvalidArgument("sampling.truncate_prompt_tokens", "a prompt with images cannot be cut")
        token_ids = truncate_prompt(token_ids, truncate_to)
        validate_prompt(token_ids, self.tokenizer.vocab_size, self.max_model_len, field)
        return token_ids

    def defaults(self, num_prompt_tokens: int) -> SamplingParams:
        """What an unset field means: max_tokens fills the context."""
        return SamplingParams(max_tokens=self.max_model_len - num_prompt_tokens)

    def sampling(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """The checked parameters, bad words turned into token sequences."""
        validate_sampling(params, num_prompt_tokens, self.max_model_len, self.tokenizer.vocab_size)
        self.tokenizer.check_text_controls(params)
        if params.bad_words:
            words = self.tokenizer.bad_words_token_ids(params.bad_words)
            check_bad_words_token_ids("sampling.bad_words", words, self.tokenizer.vocab_size)
            params.bad_words_token_ids = params.bad_words_token_ids + words
        return params
