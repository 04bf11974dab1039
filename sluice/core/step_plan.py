"""What the scheduler hands the worker for one engine step, and what comes back.

The worker caches every request it has seen, so a request is sent whole once (NewRequest) and afterwards only
as a diff (CachedRequest). A preempted request is dropped by the worker and later sent whole again.
"""
from dataclasses import dataclass, field

from sluice.core.images import ImageInput
from sluice.core.logprobs import LogprobRows
from sluice.core.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequest:
    request_id: str
    token_ids: list[int]  # prompt, plus tokens generated before a preemption
    block_ids: list[int]  # the request's whole block table so far
    num_computed_tokens: int  # tokens whose KV is already in the cache (prefix-cache hits, a fork's shared prompt)
    sampling_params: SamplingParams
    num_output_tokens: int = 0  # the tail of token_ids that the request generated before a preemption
    trace_context: dict[str, str] = field(default_factory=dict)  # W3C context of the scheduler's span, when traced
    images: list[ImageInput] = field(default_factory=list)  # in prompt order, without pixels (encoder_inputs has them)


@dataclass(slots=True)
class CachedRequest:
    request_id: str
    new_block_ids: list[int]  # appended to the worker's copy of the block table
    # tokens whose KV is in the cache before this step, as the scheduler counts them (proposals still being verified
    # count as accepted; the worker keeps its own count, which its verifications correct)
    num_computed_tokens: int
    num_blocks: int  # the table's length with the new blocks; blocks past it are dropped (rejected proposals')


@dataclass(slots=True)
class StepPlan:
    step_id: int
    new_requests: list[NewRequest] = field(default_factory=list)
    cached_requests: list[CachedRequest] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens to compute, batch order
    finished_request_ids: list[str] = field(default_factory=list)  # finished, aborted or preempted since the last step
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, destination) KV blocks to copy first
    # request id -> proposed tokens (speculative decoding): the step computes the request's newest token and these
    # after it, so that the target model verifies them all at once
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # request id -> how many tokens the worker's draft model proposes after the request's newest token, in slots
    # counted in num_scheduled_tokens (speculative method "draft")
    num_draft_tokens: dict[str, int] = field(default_factory=dict)
    # the encoder cache, changed before the step runs: the image hashes whose outputs the worker drops, then the
    # images it encodes (each hash once, with pixels) and holds until a later step drops them
    freed_encoder_hashes: list[bytes] = field(default_factory=list)
    encoder_inputs: list[ImageInput] = field(default_factory=list)

    @property
    def num_proposed(self) -> dict[str, int]:
        """Request id -> the tokens proposed after its newest token, by either method."""
        return self.num_draft_tokens or {request_id: len(tokens) for request_id, tokens in self.spec_token_ids.items()}

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not (self.num_scheduled_tokens or self.finished_request_ids or self.freed_encoder_hashes
                    or self.encoder_inputs)


@dataclass(slots=True)
class StepOutcome:
    step_id: int
    sampled_token_ids: dict[str, int]  # request id -> sampled token, only for requests that reached their last token
    # where asked: of the sampled token; with proposals, of each verified row (the accepted ones' and the sampled
    # token's first)
    logprobs: LogprobRows = field(default_factory=LogprobRows)
    prompt_logprobs: LogprobRows = field(default_factory=LogprobRows)  # of the prompt tokens this step predicted
    grammar_completed_request_ids: list[str] = field(default_factory=list)  # structured output complete (at
    # the request's last token of the step)
    grammar_errors: dict[str, str] = field(default_factory=dict)  # request id -> why its constraint cannot go on
    # request id -> the leading proposals it accepted, which come before its sampled token (a request with proposals)
    accepted_token_ids: dict[str, list[int]] = field(default_factory=dict)
