"""The worker's persistent state of each request, which the scheduler's diffs keep current."""
from dataclasses import dataclass, field

import numpy as np
import torch

from sluice.core.images import ImageInput
from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import StepPlan

_INITIAL_ROWS, _INITIAL_BLOCKS = 64, 64


@dataclass(slots=True)
class RequestState:
    """The worker's persistent copy of one request: the scheduler only sends diffs after the first step.

    Tokens sampled by a launched step reach `token_ids` when that step finishes; until then they are unresolved,
    and the newest one is row `sampled_row` of the step `sampled_step`'s sampled-token tensor on the device. A
    launched step's proposals count as accepted, in the tokens and the computed ones, until it finishes (as the
    scheduler counts them until it hears how many were): a decode after them continues on the device, from the row of
    the last one accepted.
    """

    row: int  # the request's row in BatchState.block_table
    token_ids: list[int]
    num_blocks: int
    num_computed_tokens: int
    sampling_params: SamplingParams
    num_prompt_tokens: int
    num_draft_computed: int = 0  # tokens whose KV the draft model holds (speculative method "draft")
    num_unresolved: int = 0  # tokens launched steps add: each sampled one, and the proposals before it
    num_unverified: int = 0  # proposals of launched steps
    sampled_step: int = -1
    sampled_row: int = -1
    images: list[ImageInput] = field(default_factory=list)  # in prompt order, without pixels
    mrope_positions: torch.Tensor | None = None  # [3, num_prompt_tokens] int64, of a prompt with images
    position_delta: int = 0  # a token past the prompt's last image sits at its index plus this

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids) + self.num_unresolved


class BatchState:
    """Every live request's state; block tables are rows of one persistent array, updated by the plan's diffs."""

    def __init__(self):
        self.requests: dict[str, RequestState] = {}
        self.block_table = np.zeros((_INITIAL_ROWS, _INITIAL_BLOCKS), dtype=np.int32)
        self._free_rows = list(range(_INITIAL_ROWS - 1, -1, -1))

    def apply(self, plan: StepPlan) -> None:
        for request_id in plan.finished_request_ids:
            state = self.requests.pop(request_id, None)
            if state is not None:
                self._free_rows.append(state.row)
        for new in plan.new_requests:
            state = RequestState(self._take_row(), list(new.token_ids), 0, new.num_computed_tokens,
                                 new.sampling_params, len(new.token_ids) - new.num_output_tokens,
                                 new.num_computed_tokens)
            self.requests[new.request_id] = state
            self._append_blocks(state, new.block_ids)
        for cached in plan.cached_requests:
            state = self.requests[cached.request_id]
            state.num_blocks = cached.num_blocks - len(cached.new_block_ids)  # drops a tail of rejected proposals
            if cached.new_block_ids:
                self._append_blocks(state, cached.new_block_ids)

    def record_launch(self, plan: StepPlan, states: list[RequestState], sampled: list[RequestState]) -> None:
        """The step is on the device: its tokens count as computed, and each sampling request's new token (after
        its proposals) is unresolved, at its row of the step's sampled tensor."""
        for state, num_tokens in zip(states, plan.num_scheduled_tokens.values()):
            state.num_computed_tokens += num_tokens
        for row, state in enumerate(sampled):
            state.num_unresolved += 1
            state.sampled_step, state.sampled_row = plan.step_id, row
        for request_id, proposed in plan.num_proposed.items():
            state = self.requests[request_id]
            state.num_unresolved += proposed
            state.num_unverified += proposed

    @staticmethod
    def resolve(sampled: list[RequestState], request_ids: list[str], token_ids: list[int],
                proposals: dict[str, list[int]], accepted: dict[str, list[int]]) -> None:
        """A launched step finished: its sampled tokens, after the leading ones of its `proposals` that each request
        accepted, join the requests' token lists (also those dropped since); the rejected ones stop counting."""
        for state, request_id, token_id in zip(sampled, request_ids, token_ids):
            if request_id in proposals:
                num_proposed, taken = len(proposals[request_id]), accepted[request_id]
                state.token_ids += taken
                state.num_unresolved -= num_proposed
                state.num_unverified -= num_proposed
                state.num_computed_tokens -= num_proposed - len(taken)
                state.num_draft_computed = min(state.num_draft_computed, state.num_computed_tokens)
            state.token_ids.append(token_id)
            state.num_unresolved -= 1

    def _take_row(self) -> int:
        if not self._free_rows:
            rows = self.block_table.shape[0]
            self.block_table = np.concatenate([self.block_table, np.zeros_like(self.block_table)])
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        return self._free_rows.pop()

    def _append_blocks(self, state: RequestState, block_ids: list[int]) -> None:
        end = state.num_blocks + len(block_ids)
        if end > self.block_table.shape[1]:
            width = max(end, 2 * self.block_table.shape[1])
            self.block_table = np.pad(self.block_table, ((0, 0), (0, width - self.block_table.shape[1])))
        self.block_table[state.row, state.num_blocks:end] = block_ids
        state.num_blocks = end
