"""The scheduler's settings: the KV block pool, the step's budgets, admission, speculative decoding."""
from dataclasses import dataclass

from sluice.core.kv_transfer import KV_ROLES
from sluice.core.options import option

POLICIES = ("priority", "fcfs")
SPECULATIVE_METHODS = ("ngram", "draft")


@dataclass(slots=True)
class SchedulerConfig:
    num_blocks: int = option(0, help="physical KV blocks in the pool; 0: as many as the worker's memory budget holds")
    block_size: int = option(16, help="tokens per KV block")
    max_num_seqs: int = option(256, help="requests running at once")
    max_num_batched_tokens: int = option(8192, help="tokens computed in one step (the token budget)")
    max_model_len: int = option(8192, help="prompt + output tokens of one request (at most the model's)")
    enable_prefix_caching: bool = option(True, flag="--no-prefix-caching",
                                         help="no reuse of the KV blocks of prompts' shared prefixes")
    max_num_encoder_input_tokens: int = option(8192, help="image placeholder tokens whose encoder outputs one step "
                                                          "computes (the encoder budget): an image that does not fit "
                                                          "waits for a later step, so images do not stall decodes")
    encoder_cache_size: int = option(8192, help="image placeholder tokens whose encoder outputs the worker holds, for "
                                                "the later chunks of a prompt and for other requests of the image")
    policy: str = option("priority", choices=POLICIES,
                         help="priority: lower value first, FCFS within a value; fcfs: arrival order only")
    max_waiting_requests: int = option(4096, help="requests that may wait; more get RESOURCE_EXHAUSTED")
    max_waiting_tokens: int = option(4_000_000, help="tokens the waiting requests may hold; more get "
                                                     "RESOURCE_EXHAUSTED")
    speculative_method: str | None = option(None, choices=SPECULATIVE_METHODS,
                                            help="speculative decoding: ngram proposes the tokens that followed the "
                                                 "newest tokens earlier in the prompt and output (prompt lookup), "
                                                 "draft those of the worker's --draft-model; the model verifies "
                                                 "them in one step")
    num_speculative_tokens: int = option(3, help="the most tokens proposed for a request per step")
    ngram_min: int = option(2, help="the shortest suffix of a request's tokens that ngram matches against its "
                                    "earlier tokens")
    ngram_max: int = option(4, help="the longest suffix ngram matches")
    step_timeout: float = option(60.0, help="seconds a step's result may be overdue (a step of the whole token "
                                            "budget gets twice as long) before the worker group is declared "
                                            "lost: its requests end with UNAVAILABLE and it is set up again")
    kv_role: str = option("both", choices=KV_ROLES,
                          help="prefill: requests that ask for a remote decode end at their first token, their "
                               "prompt's full blocks held on lease for a decode replica; decode: requests that name "
                               "a prefill replica's blocks pull those the prefix cache lacks before they run; both: "
                               "neither (the workers must have the same role)")
    kv_lease_timeout: float = option(30.0, help="seconds a prefill replica holds a request's blocks for the decode "
                                                "replica that never pulls them")
    kv_pull_timeout: float = option(10.0, help="seconds a decode replica waits for a pull of KV blocks before it "
                                               "fails the request with UNAVAILABLE")

    def __post_init__(self):
        if self.num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {self.num_blocks}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_waiting_requests",
                     "max_num_encoder_input_tokens", "encoder_cache_size"):
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
        if self.step_timeout <= 0:
            raise ValueError(f"step_timeout must be > 0, got {self.step_timeout}")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {list(KV_ROLES)}, got {self.kv_role!r}")
        if self.kv_role == "decode" and not self.enable_prefix_caching:
            raise ValueError("kv_role 'decode' needs prefix caching: pulled blocks join the prefix cache")
        if self.kv_lease_timeout <= 0 or self.kv_pull_timeout <= 0:
            raise ValueError("kv_lease_timeout and kv_pull_timeout must be > 0")
        if self.max_waiting_tokens < self.max_model_len:
            raise ValueError(f"max_waiting_tokens ({self.max_waiting_tokens}) must be >= max_model_len "
                             f"({self.max_model_len}), or some valid requests could never be queued")
