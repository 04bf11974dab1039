from dataclasses import dataclass

from scheduler_svc.step_plan import StepPlan
from sluice.sampling_params import SamplingParams


@dataclass(slots=True)
class RequestState:
    """The worker's persistent copy of one request: the scheduler only sends diffs after the first step."""

    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    sampling_params: SamplingParams
    num_prompt_tokens: int


class BatchState:
    def __init__(self):
        self.requests: dict[str, RequestState] = {}

    def apply(self, plan: StepPlan) -> None:
        for request_id in plan.finished_request_ids:
            self.requests.pop(request_id, None)
        for new in plan.new_requests:
            self.requests[new.request_id] = RequestState(
                list(new.token_ids), list(new.block_ids), new.num_computed_tokens, new.sampling_params,
                len(new.token_ids) - new.num_output_tokens,
            )
        for cached in plan.cached_requests:
            state = self.requests[cached.request_id]
            state.block_ids.extend(cached.new_block_ids)
            state.num_computed_tokens = cached.num_computed_tokens

    def record_step(self, plan: StepPlan, sampled: dict[str, int]) -> None:
        for request_id, num_tokens in plan.num_scheduled_tokens.items():
            self.requests[request_id].num_computed_tokens += num_tokens
        for request_id, token_id in sampled.items():
            self.requests[request_id].token_ids.append(token_id)
