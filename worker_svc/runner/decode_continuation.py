"""Decode steps that continue the one before: the same requests, in the same decode-graph rows.

Once a decode step has replayed a graph and fed it its samples, the graph's buffers hold each of its requests'
next input token, position and block table. A step that schedules exactly those requests again, one token each and
no proposals, takes from the host only the blocks they were given since, and reuses the step's logits and sampling
rows: it is a graph replay, the sampling and one small copy back.
"""
from dataclasses import dataclass

import torch

from sluice.core.step_plan import StepPlan
from worker_svc.runner.batch_state import RequestState
from worker_svc.runner.decode_graphs import DecodeGraphs
from worker_svc.runner.logits_rows import LogitsRows
from worker_svc.sampling.upload import upload


@dataclass(slots=True)
class DecodeContinuation:
    """A launched decode step whose samples the decode graphs' buffers hold as the next inputs."""

    step_id: int
    request_ids: list[str]  # in graph-row order
    rows: LogitsRows
    sampling_rows: torch.Tensor  # [len(request_ids)] int64 on the device: the requests' SamplingRows indices

    def continued_by(self, plan: StepPlan, request_ids: list[str], states: list[RequestState]) -> bool:
        """Whether the plan's step is the next decode step of the same requests, each from the token this step
        sampled."""
        return (request_ids == self.request_ids and not plan.spec_token_ids and not plan.num_draft_tokens
                and len(request_ids) == sum(plan.num_scheduled_tokens.values())
                and all(s.sampled_step == self.step_id and s.num_computed_tokens == s.num_tokens - 1 for s in states))

    def set_new_blocks(self, plan: StepPlan, graphs: DecodeGraphs) -> None:
        """Writes the blocks the plan gives the requests into their graph rows' tables."""
        grown = [cached for cached in plan.cached_requests if cached.new_block_ids]
        if not grown:
            return
        row_of = {request_id: row for row, request_id in enumerate(self.request_ids)}
        rows, columns, block_ids = [], [], []
        for cached in grown:
            first = cached.num_blocks - len(cached.new_block_ids)
            rows += [row_of[cached.request_id]] * len(cached.new_block_ids)
            columns += range(first, cached.num_blocks)
            block_ids += cached.new_block_ids
        entries = upload(rows + columns + block_ids, torch.int32, graphs.block_tables.device)
        graphs.set_blocks(*entries.split(len(rows)))
