from dataclasses import dataclass

POLICIES = ("priority", "fcfs")
SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass(slots=True)
class SchedulerConfig:
    num_blocks: int  # physical KV blocks in the pool, found by the worker's memory profile
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 256  # requests running at once
    max_num_batched_tokens: int = 8192  # tokens computed in one step (the token budget)
    max_model_len: int = 8192  # prompt + output tokens of one request
    enable_prefix_caching: bool = True
    policy: str = "priority"  # "priority": lower value first, FCFS within a value; "fcfs": arrival order only
    max_waiting_requests: int = 4096
    max_waiting_tokens: int = 4_000_000
    # "ngram": proposals by prompt lookup; "draft": by the worker's draft model; None: no speculative decoding
    speculative_method: str | None = None
    num_speculative_tokens: int = 3  # the most tokens proposed for a request per step
    ngram_min: int = 2  # the shortest suffix of a request's tokens that ngram matches against its earlier tokens
    ngram_max: int = 4

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                     "max_waiting_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.speculative_method not in (None, *SPECULATIVE_METHODS):
            raise ValueError(f"speculative_method must be one of {SPECULATIVE_METHODS}, "
                             f"got {self.speculative_method!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min} and {self.ngram_max}")
        if self.max_waiting_tokens < self.max_model_len:
            raise ValueError(f"max_waiting_tokens ({self.max_waiting_tokens}) must be >= max_model_len "
                             f"({self.max_model_len}), or some valid requests could never be queued")
