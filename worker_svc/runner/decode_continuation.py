"""Decode steps that continue the one before: some or all of its requests, one token each, or with ngram's proposals
after it.

Once a decode step has replayed a graph and its samples are fed to it, the graph's buffers hold each of its requests'
next input token, position and block table; after an ngram verification laid out as decode rows, each request
keeps the row of its last accepted token. A decode step of requests that all sampled in that step takes from the
host only their graph rows (when some left or the order changed) and the blocks they were given since: it is a graph
replay, the sampling and one small copy back. With proposals it is a verification laid out as decode rows, one per
token: the host also sends the proposals and each row's offset and row group, in one copy. The samples are fed when
the step that continues theirs is prepared: on a pipeline stage before the last, on the CPU, once they have come from
the last stage (on CUDA, the device stream already waits for them).
"""
from dataclasses import dataclass

import torch

from sluice.core.step_plan import StepPlan
from sluice.worker.runner.batch_state import RequestState
from sluice.worker.runner.decode_graphs import DecodeGraphs
from sluice.worker.runner.logits_rows import LogitsRows
from sluice.worker.sampling.step import DeviceSample
from sluice.worker.sampling.upload import upload


@dataclass(slots=True)
class DecodeContinuation:
    """A launched decode step whose samples become the decode graphs' next inputs."""

    step_id: int
    request_ids: list[str]  # in graph-row order
    sampling_rows: torch.Tensor  # [len(request_ids)] int64 on the device: the requests' SamplingRows indices (none
    # on a tensor-parallel follower)
    sample: DeviceSample  # the step's, one token per request, in graph-row order

    def continued_by(self, plan: StepPlan, states: list[RequestState], graphs: DecodeGraphs) -> bool:
        """Whether the plan's step computes, from the token each sampled in this step, only requests of this step:
        each its newest token, and ngram's proposals after it, in rows that the graphs hold."""
        num_tokens = sum(plan.num_scheduled_tokens.values())
        num_proposed = sum(len(tokens) for tokens in plan.spec_token_ids.values())
        return (not plan.num_draft_tokens and len(states) + num_proposed == num_tokens and graphs.fits(num_tokens)
                and all(s.sampled_step == self.step_id and s.num_computed_tokens == s.num_tokens - 1 for s in states))

    def prepare(self, plan: StepPlan, request_ids: list[str], graphs: DecodeGraphs) -> tuple[LogitsRows, torch.Tensor]:
        """Puts the plan's requests in the graph's first rows, in the plan's order, with their new blocks (a row per
        token of a verification); returns the step's logits rows and sampling rows."""
        if self.sample.arriving is not None:
            self.sample.arriving.result()
        graphs.feed(self.sample.token_ids)
        row_of = {request_id: row for row, request_id in enumerate(self.request_ids)}
        rows = [row_of[request_id] for request_id in request_ids]
        n = len(rows)
        sampling_rows = self.sampling_rows[:n]
        if plan.spec_token_ids:
            _set_new_blocks(plan, self.request_ids, graphs)  # before the rows are copied out of these
            layout = _verification_layout(rows, request_ids, plan.spec_token_ids, graphs.max_group_rows)
            num_rows = len(layout) // 4
            layout_t, rows_t = upload(layout + rows, torch.int64, graphs.input_ids.device).split([4 * num_rows, n])
            graphs.lay_out_verification(layout_t.view(4, num_rows))
            if self.sampling_rows.numel():
                sampling_rows = self.sampling_rows[rows_t]
            return LogitsRows(request_ids, num_rows, list(range(num_rows))), sampling_rows
        if rows == list(range(n)):
            graphs.keep_first(n)
        else:
            index = upload(rows, torch.int64, self.sampling_rows.device)
            graphs.move_rows(index)
            if self.sampling_rows.numel():  # a tensor-parallel follower samples nothing: it holds no rows
                sampling_rows = self.sampling_rows[index]
        _set_new_blocks(plan, request_ids, graphs)
        return LogitsRows(request_ids, n, list(range(n))), sampling_rows


def _verification_layout(rows: list[int], request_ids: list[str], proposals: dict[str, list[int]],
                         rows_per_program: int) -> list[int]:
    """DecodeGraphs.lay_out_verification's [4, num_tokens] layout, flattened: per token, its request's graph row, its
    offset past the newest token, its proposed input id (0 for the newest token, which the row holds) and its row
    group (as step_inputs groups a verification's rows)."""
    sources, offsets, proposed, groups = [], [], [], []
    for row, request_id in zip(rows, request_ids):
        tokens = proposals.get(request_id, ())
        num_rows = 1 + len(tokens)
        sources += [row] * num_rows
        offsets += range(num_rows)
        proposed += [0, *tokens]
        groups += [min(rows_per_program, num_rows - j) if j % rows_per_program == 0 else 0 for j in range(num_rows)]
    return sources + offsets + proposed + groups


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
