"""What the router and its schedulers say to each other, as the router's logic sees it: the scheduler link turns
these into scheduler.proto messages and back."""
from dataclasses import dataclass, field

import grpc

from sluice.core.finish_reason import FinishReason
from sluice.core.images import ImageInput
from sluice.core.kv_transfer import KvTransferParams
from sluice.core.logprobs import Logprobs
from sluice.core.sampling_params import SamplingParams


@dataclass(slots=True)
class Submission:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    priority: int = 0
    cache_salt: str = ""
    deadline_unix_seconds: float = 0.0  # 0 means none
    trace_context: dict[str, str] = field(default_factory=dict)  # W3C context of the router's span
    images: list[ImageInput] = field(default_factory=list)  # in prompt order, at placeholders of prompt_token_ids
    kv_transfer: KvTransferParams | None = None  # a leg of a disaggregated request


@dataclass(slots=True)
class Tokens:
    index: int  # the sample
    token_ids: list[int] = field(default_factory=list)
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None

    def extend(self, token_ids, logprobs: Logprobs | None = None, prompt_logprobs: Logprobs | None = None) -> None:
        """Appends a later step's news."""
        self.token_ids += token_ids
        self.logprobs = joined_logprobs(self.logprobs, logprobs)
        self.prompt_logprobs = joined_logprobs(self.prompt_logprobs, prompt_logprobs)


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class Finished:
    index: int  # the sample
    reason: FinishReason
    usage: Usage
    kv_transfer: KvTransferParams | None = None  # a prefill leg's blocks, held for its decode leg


@dataclass(slots=True)
class Failed:
    """The request ended without finishing: rejected, past its deadline, or its scheduler lost."""

    status: grpc.StatusCode
    details: str


Event = Tokens | Finished | Failed


def joined_logprobs(first: Logprobs | None, second: Logprobs | None) -> Logprobs | None:
    """Both, in order (extending the first in place), or whichever is not None."""
    if first is None or second is None:
        return second if first is None else first
    first.extend(second)
    return first
