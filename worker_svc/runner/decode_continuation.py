"""Decode steps that continue the one before: some or all of its requests, one token each.

Once a decode step has replayed a graph and fed it its samples, the graph's buffers hold each of its requests'
next input token, position and block table; after an ngram verification laid out as decode rows, each request
keeps the row of its last accepted token. A decode step of requests that all sampled in that step, with no
proposals, takes from the host only their graph rows (when some left or the order changed) and the blocks they were
given since: it is a graph replay, the sampling and one small copy back.
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
    sampling_rows: torch.Tensor  # [len(request_ids)] int64 on the device: the requests' SamplingRows indices (none
    # on a tensor-parallel follower)

    def continued_by(self, plan: StepPlan, states: list[RequestState]) -> bool:
        """Whether the plan's step decodes, from the token each sampled in this step, only requests of this step."""
        return (not plan.spec_token_ids and not plan.num_draft_tokens
                and len(states) == sum(plan.num_scheduled_tokens.values())
                and all(s.sampled_step == self.step_id and s.num_computed_tokens == s.num_tokens - 1 for s in states))

    def prepare(self, plan: StepPlan, request_ids: list[str], graphs: DecodeGraphs) -> tuple[LogitsRows, torch.Tensor]:
        """Puts the plan's requests in the graph's first rows, in the plan's order, with their new blocks; returns the
        step's logits rows and sampling rows."""
        row_of = {request_id: row for row, request_id in enumerate(self.request_ids)}
        rows = [row_of[request_id] for request_id in request_ids]
        n = len(rows)
        sampling_rows = self.sampling_rows[:n]
        if rows == list(range(n)):
            graphs.keep_first(n)
        else:
            index = upload(rows, torch.int64, self.sampling_rows.device)
            graphs.move_rows(index)
            if self.sampling_rows.numel():  # a tensor-parallel follower samples nothing: it holds no rows
                sampling_rows = self.sampling_rows[index]
        _set_new_blocks(plan, request_ids, graphs)
        return LogitsRows(request_ids, n, list(range(n))), sampling_rows


def _set_new_blocks(plan: StepPlan, request_ids: list[str], graphs: DecodeGraphs) -> None:
    """Writes the blocks the plan gives the requests into their graph rows' tables."""
    grown = [cached for cached in plan.cached_requests if cached.new_block_ids]
    if not grown:
        return
    row_of = {request_id: row for row, request_id in enumerate(request_ids)}
    rows, columns, block_ids = [], [], []
    width = graphs.block_tables.shape[1]  # blocks past the longest context are never read
    for cached in grown:
        first = cached.num_blocks - len(cached.new_block_ids)
        kept = cached.new_block_ids[:max(width - first, 0)]
        rows += [row_of[cached.request_id]] * len(kept)
        columns += range(first, first + len(kept))
        block_ids += kept
    if not rows:
        return
    entries = upload(rows + columns + block_ids, torch.int32, graphs.block_tables.device)
    graphs.set_blocks(*entries.split(len(rows)))
