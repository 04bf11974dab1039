"""One request in the scheduler: its tokens, its status and why it finished."""
import enum
import time
from dataclasses import dataclass, field

from sluice.core.finish_reason import FinishReason
from sluice.core.images import ImageInput
from sluice.core.kv_transfer import KvTransferParams
from sluice.core.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()  # waiting again after its blocks were taken; recomputed when it resumes
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_DEADLINE = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED_STATUS.values()


_FINISHED_STATUS = {
    FinishReason.STOP: RequestStatus.FINISHED_STOPPED,
    FinishReason.LENGTH: RequestStatus.FINISHED_LENGTH,
    FinishReason.ABORT: RequestStatus.FINISHED_ABORTED,
    FinishReason.DEADLINE: RequestStatus.FINISHED_DEADLINE,
    FinishReason.ERROR: RequestStatus.FINISHED_ERROR,
}


@dataclass(slots=True, eq=False)
class Request:
    """One generation request and where it stands. `arrival_time` and `deadline` use the clock of expire_deadlines."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0  # lower runs first under the "priority" policy
    arrival_time: float = field(default_factory=time.monotonic)
    cache_salt: str | None = None  # isolates this request's prefix-cache entries from other salts
    deadline: float | None = None
    group_id: str | None = None  # the client's request id, for one of the samples of an n > 1 request
    sample_index: int = 0
    images: tuple[ImageInput, ...] = ()  # in prompt order; their placeholders are prompt tokens
    kv_transfer: KvTransferParams | None = None  # a leg of a disaggregated request

    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    output_token_ids: list[int] = field(default_factory=list, init=False)
    all_token_ids: list[int] = field(init=False)  # prompt + output, grown in place
    num_computed_tokens: int = field(default=0, init=False)  # tokens whose KV is in the cache
    num_cached_tokens: int = field(default=0, init=False)  # prompt tokens served from the prefix cache (usage)
    num_preemptions: int = field(default=0, init=False)
    preempted_at_step: int = field(default=-1, init=False)  # results of earlier steps belong to a dropped run
    last_step: int = field(default=-1, init=False)  # the newest step planned with tokens of it
    # tokens the worker samples in steps still in flight (async scheduling): it feeds them forward itself; a step that
    # verifies proposals counts them as accepted until its outcome says how many were
    num_output_placeholders: int = field(default=0, init=False)
    num_prompt_logprobs_sent: int = field(default=0, init=False)  # a recompute after preemption must not resend
    kv_lease: KvTransferParams | None = field(default=None, init=False)  # a finished prefill leg's held blocks

    def __post_init__(self):
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def client_request_id(self) -> str:
        return self.group_id or self.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens_to_compute(self) -> int:
        return len(self.all_token_ids) + self.num_output_placeholders - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def finish(self, reason: FinishReason) -> None:
        self.status = _FINISHED_STATUS[reason]
        self.finish_reason = reason
