"""The draft model of speculative method "draft": a smaller model of the target's vocabulary that runs beside it in
the worker, with a KV cache of its own over the same block tables (the same slots), and proposes each drafting
request's tokens at the start of the request's step.

Each step the draft first catches up: one pass computes every scheduled request's tokens that its KV lacks, up to
where the target's chunk ends short of the draft slots (prefill chunks included, so its KV follows the target's);
the last row of a drafting request gives its first proposal. Each further proposal is one decode pass over the
requests that draft that many. Everything is queued on the device, as the target's pass is: nothing waits for the
host, a pass's host-side inputs go up in one copy, and the passes replay the draft's own CUDA graphs (`forward`)."""
import numpy as np
import torch

from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.batch_state import BatchState, RequestState
from sluice.worker.runner.forward_pass import ForwardPass
from sluice.worker.runner.step_inputs import SampledTokens, StepInputBuilder
from sluice.worker.sampling.draft_sampling import draw_proposals
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.speculative import Drafts
from sluice.worker.sampling.upload import upload


class DraftProposer:
    def __init__(self, forward: ForwardPass, block_size: int, device: torch.device):
        self.forward = forward
        self.kv_caches = forward.kv_caches
        self.block_size = block_size
        self.device = device
        self.inputs = StepInputBuilder(block_size, device)

    def propose(self, batch: BatchState, request_ids: list[str], states: list[RequestState], query_lens: list[int],
                num_draft_tokens: dict[str, int], rows: SamplingRows, previous: SampledTokens | None) -> Drafts | None:
        """Catches the draft's KV up with the step's tokens and draws the drafting requests' proposals (None when
        no request drafts)."""
        counts = [num_draft_tokens.get(request_id, 0) for request_id in request_ids]
        starts = [state.num_draft_computed for state in states]
        ends = [state.num_computed_tokens + length - count for state, length, count in zip(states, query_lens, counts)]
        lens = [end - start for start, end in zip(starts, ends)]
        drafting = [i for i, count in enumerate(counts) if count]
        last_rows = np.cumsum(lens) - 1
        draft_ids = [request_ids[i] for i in drafting]
        inputs = self.inputs.build(batch, states, lens, last_rows[drafting].tolist(), rows.indices(draft_ids),
                                   previous, starts=starts)
        logits = self.forward.logits(inputs.token_inputs, inputs.meta, inputs.logits_indices)
        for state, end, count in zip(states, ends, counts):
            state.num_draft_computed = end + max(count - 1, 0)  # the last proposal is the target's to compute
        if not drafting:
            return None
        tensors = rows.gather(draft_ids, inputs.sampling_rows)
        draft_counts = [counts[i] for i in drafting]
        width = max(draft_counts)
        token_ids = torch.empty(len(drafting), width, dtype=torch.int64, device=self.device)
        token_ids[:, 0], first_probs = draw_proposals(logits, tensors)
        probs = None
        if first_probs is not None:
            probs = first_probs.new_empty(len(drafting), width, first_probs.shape[1])
            probs[:, 0] = first_probs
        passes = _DecodePasses(batch, [states[i] for i in drafting], draft_counts, self.block_size, self.device)
        output_positions = None if tensors.draws is None else tensors.draws.output_positions
        active_ids = draft_ids
        for j, (active, meta, positions, sources, destinations) in enumerate(passes, 1):
            if len(active) != len(active_ids):
                active_ids = [draft_ids[a] for a in active]
                tensors = rows.gather(active_ids, inputs.sampling_rows[passes.active_t(j)])
                output_positions = None if tensors.draws is None else tensors.draws.output_positions
            if output_positions is not None:
                tensors.draws.output_positions = output_positions + j
            token_inputs = torch.stack((token_ids.view(-1).index_select(0, sources), positions, meta.slot_mapping))
            logits = self.forward.logits(token_inputs, meta, None)
            proposals, pass_probs = draw_proposals(logits, tensors)
            token_ids.view(-1).index_copy_(0, destinations, proposals)
            if probs is not None and pass_probs is not None:
                probs.view(-1, probs.shape[2]).index_copy_(0, destinations, pass_probs)
        return Drafts(draft_ids, draft_counts, token_ids, probs)


class _DecodePasses:
    """The draft's decode passes 1 .. max(counts) - 1 of a step: pass j feeds proposal j of each request that drafts
    more than j tokens, at position newest + j. Their host-side inputs are uploaded at once."""

    def __init__(self, batch: BatchState, states: list[RequestState], counts: list[int], block_size: int,
                 device: torch.device):
        width = max(counts)
        self.device = device
        self.actives = [[a for a, count in enumerate(counts) if count > j] for j in range(1, width)]
        newest = np.fromiter((state.num_computed_tokens for state in states), np.int64, len(states))
        table_rows = np.fromiter((state.row for state in states), np.int64, len(states))
        self.num_blocks = max(state.num_blocks for state in states)
        tables = batch.block_table[table_rows, :self.num_blocks].astype(np.int64)
        pieces = []
        self.max_seq_lens = []
        for j, active in enumerate(self.actives, 1):
            active = np.asarray(active, dtype=np.int64)
            positions = newest[active] + j
            slots = tables[active, positions // block_size] * block_size + positions % block_size
            pieces += [positions, slots, positions + 1, active * width + j - 1, active * width + j, active,
                       tables[active].ravel()]
            self.max_seq_lens.append(int(positions.max()) + 1)
        self.uploaded = upload(np.concatenate(pieces), torch.int64, device).split_with_sizes(
            [piece.size for piece in pieces]) if pieces else []

    def active_t(self, j: int) -> torch.Tensor:
        return self.uploaded[7 * (j - 1) + 5]

    def __iter__(self):
        for j, active in enumerate(self.actives, 1):
            positions, slots, seq_lens, sources, destinations, _, tables = self.uploaded[7 * (j - 1):7 * j]
            n = len(active)
            meta = AttentionMetadata(
                slot_mapping=slots, query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=self.device),
                seq_lens=seq_lens.int(), block_tables=tables.int().view(n, self.num_blocks),
                token_seq_index=torch.arange(n, device=self.device),
                token_query_pos=torch.zeros(n, dtype=torch.int64, device=self.device),
                max_query_len=1, max_seq_len=self.max_seq_lens[j - 1])
            yield active, meta, positions, sources, destinations
