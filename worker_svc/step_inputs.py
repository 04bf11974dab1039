"""A step's model inputs, computed with numpy on the host and moved to the device in one copy per dtype."""
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch

from worker_svc.attention_metadata import AttentionMetadata
from worker_svc.batch_state import BatchState, RequestState


@dataclass(slots=True)
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata


class StepInputBuilder:
    def __init__(self, block_size: int, device: torch.device):
        self.block_size = block_size
        self.device = device
        self._staging: dict[torch.dtype, torch.Tensor] = {}

    def build(self, batch: BatchState, states: list[RequestState], query_lens: list[int]) -> StepInputs:
        n = len(states)
        starts = np.fromiter((s.num_computed_tokens for s in states), np.int64, n)
        lens = np.asarray(query_lens, dtype=np.int64)
        query_start_loc = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        if num_tokens == n:  # a pure decode step: one token per request
            input_ids = np.fromiter((s.token_ids[s.num_computed_tokens] for s in states), np.int64, n)
            seq_index, query_pos = np.arange(n), np.zeros(n, dtype=np.int64)
        else:
            input_ids = np.fromiter(chain.from_iterable(
                s.token_ids[start:start + length] for s, start, length in zip(states, starts.tolist(), query_lens)),
                np.int64, num_tokens)
            seq_index = np.repeat(np.arange(n), lens)
            query_pos = np.arange(num_tokens) - query_start_loc[:-1][seq_index]
        positions = starts[seq_index] + query_pos
        rows = np.fromiter((s.row for s in states), np.int64, n)
        max_blocks = max(s.num_blocks for s in states)
        tables = batch.block_table[rows, :max_blocks]
        slots = tables[seq_index, positions // self.block_size].astype(np.int64) * self.block_size \
            + positions % self.block_size
        seq_lens = starts + lens

        longs = self._to_device(torch.int64, [input_ids, positions, slots, seq_index, query_pos])
        ints = self._to_device(torch.int32, [query_start_loc, seq_lens, tables.ravel()])
        input_ids_t, positions_t, slots_t, seq_index_t, query_pos_t = longs
        query_start_loc_t, seq_lens_t, tables_t = ints
        meta = AttentionMetadata(
            slot_mapping=slots_t, query_start_loc=query_start_loc_t, seq_lens=seq_lens_t,
            block_tables=tables_t.view(n, max_blocks), token_seq_index=seq_index_t, token_query_pos=query_pos_t,
            max_query_len=int(lens.max()), max_seq_len=int(seq_lens.max()))
        return StepInputs(input_ids_t, positions_t, meta)

    def _to_device(self, dtype: torch.dtype, arrays: list[np.ndarray]) -> list[torch.Tensor]:
        """Packs arrays into one host buffer (pinned on a GPU) and copies it to the device at once."""
        sizes = [a.size for a in arrays]
        host = self._host_buffer(dtype, sum(sizes))
        np.concatenate(arrays, out=host.numpy(), casting="unsafe")
        packed = host.to(self.device, non_blocking=True) if self.device.type != "cpu" else host.clone()
        return list(packed.split(sizes))

    def _host_buffer(self, dtype: torch.dtype, size: int) -> torch.Tensor:
        buffer = self._staging.get(dtype)
        if buffer is None or buffer.numel() < size:
            buffer = torch.empty(max(size, 2 * (buffer.numel() if buffer is not None else 0)), dtype=dtype)
            if self.device.type == "cuda":
                buffer = buffer.pin_memory()
            self._staging[dtype] = buffer
        return buffer[:size]
