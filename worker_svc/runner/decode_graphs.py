"""CUDA graphs of the decode forward pass, captured once per batch size of a ladder.

A decode-only step of n requests replays the smallest captured graph of at least n rows; the extra rows are padding
(slot -1, so nothing is written to the KV cache; their logits are ignored). All inputs live in static buffers.
"""
import torch

from worker_svc.models.attention_metadata import AttentionMetadata


def batch_size_ladder(max_batch_size: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch_size + 1, 16))
    return sorted({size for size in sizes if size <= max_batch_size} | {max_batch_size})


class DecodeGraphs:
    def __init__(self, model, kv_caches, cos_sin_cache: torch.Tensor, max_batch_size: int, max_blocks_per_seq: int,
                 device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.cos_sin_cache = cos_sin_cache
        self.sizes = batch_size_ladder(max_batch_size)
        n = max_batch_size
        self.token_inputs = torch.zeros(3, n, dtype=torch.int64, device=device)  # input ids, positions, KV slots
        self.input_ids, self.positions, self.slot_mapping = self.token_inputs
        self.slot_mapping.fill_(-1)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.rows = torch.arange(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._capture_all()

    def _metadata(self, batch_size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch_size], query_start_loc=self.query_start_loc[:batch_size + 1],
            seq_lens=self.seq_lens[:batch_size], block_tables=self.block_tables[:batch_size],
            token_seq_index=self.rows[:batch_size], token_query_pos=torch.zeros_like(self.rows[:batch_size]),
            max_query_len=1, max_seq_len=self.block_tables.shape[1] * self.kv_caches[0][0].shape[1])

    def _forward(self, batch_size: int) -> torch.Tensor:
        return self.model(self.input_ids[:batch_size], self.positions[:batch_size], self.cos_sin_cache,
                          self.kv_caches, self._metadata(batch_size), None)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for batch_size in reversed(self.sizes):  # the largest first, so smaller graphs reuse its memory pool
            self._forward(batch_size)  # warm-up: compiles the kernels outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch_size] = self._forward(batch_size)
            pool = graph.pool()
            self.graphs[batch_size] = graph

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def run(self, token_inputs, seq_lens, block_tables) -> torch.Tensor:
        """token_inputs: [3, n] int64 input ids, positions and KV slots."""
        n = token_inputs.shape[1]
        batch_size = next(size for size in self.sizes if size >= n)
        self.token_inputs[:, :n].copy_(token_inputs)
        self.seq_lens[:n].copy_(seq_lens)
        self.block_tables[:n, : block_tables.shape[1]].copy_(block_tables)
        if batch_size > n:
            self.slot_mapping[n:batch_size].fill_(-1)
            self.seq_lens[n:batch_size].fill_(1)
        self.graphs[batch_size].replay()
        return self.logits[batch_size][:n]
