from dataclasses import dataclass

import numpy as np

from scheduler_svc.step_plan import StepPlan
from sluice.sampling_params import SamplingParams

_INITIAL_ROWS, _INITIAL_BLOCKS = 64, 64


@dataclass(slots=True)
class RequestState:
    """The worker's persistent copy of one request: the scheduler only sends diffs after the first step."""

    row: int  # the request's row in BatchState.block_table
    token_ids: list[int]
    num_blocks: int
    num_computed_tokens: int
    sampling_params: SamplingParams
    num_prompt_tokens: int


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
                                 new.sampling_params, len(new.token_ids) - new.num_output_tokens)
            self.requests[new.request_id] = state
            self._append_blocks(state, new.block_ids)
        for cached in plan.cached_requests:
            state = self.requests[cached.request_id]
            self._append_blocks(state, cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens

    def record_step(self, plan: StepPlan, sampled: dict[str, int]) -> None:
        for request_id, num_tokens in plan.num_scheduled_tokens.items():
            self.requests[request_id].num_computed_tokens += num_tokens
        for request_id, token_id in sampled.items():
            self.requests[request_id].token_ids.append(token_id)

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
