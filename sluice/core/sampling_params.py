"""SamplingParams: how one request samples and when it stops, shared by all three services."""
from dataclasses import dataclass, field

CONSTRAINT_FIELDS = ("json_schema", "regex", "choice", "grammar")
GREEDY_BELOW_TEMPERATURE = 1e-5  # smaller temperatures overflow the scaled logits; they mean greedy


@dataclass(slots=True)
class SamplingParams:
    """How one request samples and when it stops. Plain data shared by all three services."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW_TEMPERATURE) means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 means the whole vocabulary
    min_p: float = 0.0
    seed: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    n: int = 1  # independent samples of the prompt
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] = field(default_factory=list)  # empty: any token
    truncate_prompt_tokens: int | None = None  # the router keeps only the prompt's last k tokens
    bad_words: list[str] = field(default_factory=list)  # the router turns them into bad_words_token_ids
    bad_words_token_ids: list[list[int]] = field(default_factory=list)  # sequences whose last token is banned after
    # the others (a one-token sequence always)
    stop: list[str] = field(default_factory=list)  # stop strings, matched by the router
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # None: none; k: the sampled token's logprob and the k most likely alternatives
    prompt_logprobs: int | None = None
    # structured output, at most one of:
    json_schema: str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # Lark syntax

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def constraint(self) -> str | None:
        """The name of the structured-output field that is set, if one is."""
        return next((name for name in CONSTRAINT_FIELDS if getattr(self, name) is not None), None)

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1
