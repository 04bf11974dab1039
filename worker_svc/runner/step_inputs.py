"""A step's model inputs, computed with numpy on the host and moved to the device in one copy per dtype.

A request's newest token may still be unresolved (sampled by the step before, not yet copied back): its input id is
taken on the device from that step's sampled tokens, so a step never waits for the one before it.

A step in which every request computes only its newest token and its proposals (speculative decoding) is laid out as
a decode step of one row per token: row j of a request attends to its context up to that token, through the same
block table. So it runs the decode attention kernel, which reads the context once for up to `rows_per_program` rows
of a request (their row groups), and replays a decode graph.
"""
from dataclasses import dataclass
from itertools import chain, repeat

import numpy as np
import torch

from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.batch_state import BatchState, RequestState
from sluice.worker.runner.image_inputs import ImageStepInputs


@dataclass(slots=True)
class StepInputs:
    token_inputs: torch.Tensor  # [3, num_tokens] int64: input ids, positions and KV slots, one row each
    meta: AttentionMetadata
    logits_indices: torch.Tensor  # [num_logits] int64: the tokens whose logits the step needs
    sampling_rows: torch.Tensor  # [num_samples] int64: the sampling requests' rows in SamplingRows
    images: ImageStepInputs | None = None  # a vision-language model's step that reaches a prompt's images
    position_deltas: torch.Tensor | None = None  # [num_tokens] int64: added to each token's position for its rope

    @property
    def input_ids(self) -> torch.Tensor:
        return self.token_inputs[0]

    @property
    def positions(self) -> torch.Tensor:
        return self.token_inputs[1]


@dataclass(slots=True)
class SampledTokens:
    step_id: int
    token_ids: torch.Tensor  # [num_samples] int64 on the device


class StepInputBuilder:
    def __init__(self, block_size: int, device: torch.device, rows_per_program: int = 1):
        self.block_size = block_size
        self.device = device
        self.rows_per_program = rows_per_program
        # two sets of host buffers, used in turn: a step fills one while the previous step's upload may be pending
        self._staging: dict[tuple[torch.dtype, int], torch.Tensor] = {}
        self._uploaded: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    def build(self, batch: BatchState, states: list[RequestState], query_lens: list[int], logits_indices: list[int],
              sampling_rows: list[int], previous: SampledTokens | None, proposals: list[list[int]] | None = None,
              starts: list[int] | None = None, position_deltas: list[int] | None = None) -> StepInputs:
        """proposals: each request's proposed tokens, computed after its newest token (speculative decoding);
        starts: where each request's tokens start (default: at its computed tokens; the draft model's may lag);
        position_deltas: what each request's tokens' rope positions add to their index (None: nothing)."""
        n = len(states)
        starts = np.fromiter((s.num_computed_tokens for s in states), np.int64, n) if starts is None \
            else np.asarray(starts, dtype=np.int64)
        lens = np.asarray(query_lens, dtype=np.int64)
        query_start_loc = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        if num_tokens == n:  # a pure decode step: one token per request
            input_ids = np.fromiter((_token_or_unresolved(s, start) for s, start in zip(states, starts.tolist())),
                                    np.int64, n)
            seq_index, query_pos = np.arange(n), np.zeros(n, dtype=np.int64)
        else:
            input_ids = np.fromiter(chain.from_iterable(
                _chunk(s, start, length, proposed)
                for s, start, length, proposed in zip(states, starts.tolist(), query_lens, proposals or repeat(()))),
                np.int64, num_tokens)
            seq_index = np.repeat(np.arange(n), lens)
            query_pos = np.arange(num_tokens) - query_start_loc[:-1][seq_index]
        positions = starts[seq_index] + query_pos
        unresolved = np.flatnonzero(input_ids < 0)
        unresolved_rows = _previous_rows([states[i] for i in seq_index[unresolved]], positions[unresolved].tolist(),
                                         previous)
        rows = np.fromiter((s.row for s in states), np.int64, n)
        max_blocks = max(s.num_blocks for s in states)
        tables = batch.block_table[rows, :max_blocks]
        slots = tables[seq_index, positions // self.block_size].astype(np.int64) * self.block_size \
            + positions % self.block_size
        token_deltas = () if position_deltas is None else np.asarray(position_deltas, dtype=np.int64)[seq_index]
        seq_lens = starts + lens
        row_groups = None
        if proposals is not None and num_tokens > n and \
                all(length == len(proposed) + 1 for length, proposed in zip(query_lens, proposals)):
            per_program = self.rows_per_program
            row_groups = np.where(query_pos % per_program == 0,
                                  np.minimum(per_program, lens[seq_index] - query_pos), 0)
            tables, seq_lens = tables[seq_index], positions + 1
            n, seq_index, query_pos = num_tokens, np.arange(num_tokens), np.zeros(num_tokens, dtype=np.int64)
            query_start_loc, lens = np.arange(num_tokens + 1), np.ones(num_tokens, dtype=np.int64)

        self._turn ^= 1
        if self._uploaded[self._turn] is not None:
            self._uploaded[self._turn].synchronize()
        longs = self._to_device(torch.int64, [np.stack([input_ids, positions, slots]), seq_index, query_pos,
                                              logits_indices, sampling_rows, unresolved, unresolved_rows,
                                              token_deltas])
        ints = self._to_device(torch.int32, [query_start_loc, seq_lens, tables.ravel(),
                                             () if row_groups is None else row_groups])
        if self.device.type == "cuda":
            self._uploaded[self._turn] = torch.cuda.Event()
            self._uploaded[self._turn].record(self._stream)
        token_inputs_t, seq_index_t, query_pos_t, logits_t, rows_t, unresolved_t, previous_t, deltas_t = longs
        token_inputs_t = token_inputs_t.view(3, num_tokens)
        if unresolved.size:
            token_inputs_t[0].index_copy_(0, unresolved_t, previous.token_ids.index_select(0, previous_t))
        query_start_loc_t, seq_lens_t, tables_t, row_groups_t = ints
        meta = AttentionMetadata(
            slot_mapping=token_inputs_t[2], query_start_loc=query_start_loc_t, seq_lens=seq_lens_t,
            block_tables=tables_t.view(n, max_blocks), token_seq_index=seq_index_t, token_query_pos=query_pos_t,
            max_query_len=int(lens.max()), max_seq_len=int(seq_lens.max()),
            row_groups=None if row_groups is None else row_groups_t, max_group_rows=self.rows_per_program)
        return StepInputs(token_inputs_t, meta, logits_t, rows_t,
                          position_deltas=None if position_deltas is None else deltas_t)

    def _to_device(self, dtype: torch.dtype, arrays: list) -> list[torch.Tensor]:
        """Packs arrays into one host buffer (pinned on a GPU) and copies it to the device at once. Each array starts
        at a 16-byte-aligned offset: Triton compiles a kernel once per alignment of its pointer arguments."""
        arrays = [np.asarray(a).ravel() for a in arrays]
        align = 16 // dtype.itemsize
        pieces = list(chain.from_iterable((a.size, -a.size % align) for a in arrays))  # each array, its padding
        host = self._host_buffer(dtype, sum(pieces))
        host_array = host.numpy()
        start = 0
        for a, padding in zip(arrays, pieces[1::2]):
            host_array[start:start + a.size] = a
            start += a.size + padding
        packed = host.to(self.device, non_blocking=True) if self.device.type != "cpu" else host.clone()
        return packed.split_with_sizes(pieces)[::2]

    def _host_buffer(self, dtype: torch.dtype, size: int) -> torch.Tensor:
        buffer = self._staging.get((dtype, self._turn))
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, 2 * (buffer.numel() if buffer is not None else 0)), dtype=dtype)
            if self.device.type == "cuda":
                buffer = buffer.pin_memory()
            self._staging[dtype, self._turn] = buffer
        return buffer[:size]


def _token_or_unresolved(state: RequestState, index: int) -> int:
    return state.token_ids[index] if index < len(state.token_ids) else -1


def _chunk(state: RequestState, start: int, length: int, proposals) -> list[int]:
    """The chunk's input ids, -1 for the newest token while unresolved, then the proposals after it."""
    length -= len(proposals)
    tokens = state.token_ids[start:start + length]
    return [*tokens, *[-1] * (length - len(tokens)), *proposals]


def _previous_rows(states: list[RequestState], positions: list[int], previous: SampledTokens | None) -> list[int]:
    """Where each unresolved input token (the request's newest) is in the previous step's sampled tokens."""
    for state, position in zip(states, positions):
        if previous is None or state.sampled_step != previous.step_id or position != state.num_tokens - 1:
            raise RuntimeError("an input token is neither on the host nor among the previous step's samples")
    return [state.sampled_row for state in states]
