"""What the scheduler reports to the router: per-request token deltas and the replica's load."""
from dataclasses import dataclass, field

from sluice.core.errors import SluiceError
from sluice.core.finish_reason import FinishReason
from sluice.core.kv_transfer import KvTransferParams
from sluice.core.logprobs import Logprobs


@dataclass(slots=True)
class RequestUpdate:
    request_id: str  # the client's
    new_token_ids: list[int]  # tokens sampled since the last update (a delta)
    finish_reason: FinishReason | None  # None while the request runs on
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_output_tokens: int  # all tokens generated so far
    sample_index: int = 0  # which of the request's n samples
    logprobs: Logprobs | None = None  # of new_token_ids, where asked
    prompt_logprobs: Logprobs | None = None  # of prompt tokens not sent before, where asked
    error: SluiceError | None = None  # why the request failed (finish_reason ERROR)
    kv_transfer: KvTransferParams | None = None  # a finished prefill leg's blocks, held for its decode leg

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class LoadSnapshot:
    num_running: int
    num_waiting: int
    num_used_blocks: int
    num_free_blocks: int  # includes cached blocks no request holds (evictable)
    num_total_blocks: int
    prefix_cache_hit_rate: float  # hit tokens / queried tokens since start
    num_preemptions: int  # since start
    engine_silence: float | None  # seconds without a step's outcome while steps are in flight; None while none is
    # tokens to prefill: the waiting requests' (a preempted one's output too), and the prompt, less its prefix-cache
    # hit, of each running request that has no token yet
    num_prefill_pending_tokens: int
    # speculative decoding, since start
    num_drafts: int = 0  # request-steps with proposals
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_position: list[int] = field(default_factory=list)  # index 0: the first proposed token
