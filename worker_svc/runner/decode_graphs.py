"""CUDA graphs of the decode forward pass, captured once per batch size of a ladder.

A decode-only step of n requests replays the smallest captured graph of at least n rows; the extra rows are padding
(not live: slot -1, so nothing is written to the KV cache; their logits are ignored). All inputs live in static
buffers, and each graph computes its step's positions, KV slots and context lengths itself from where each row's
next token sits (`next_positions`), which it then advances. So the buffers carry one step into the next: once the
step's sampled tokens are written into `input_ids` (`feed`), a step of some of those requests needs no inputs from
the host but their rows (`keep_first`, `move_rows`) and the blocks they were given since (`set_blocks`). A model
whose tokens may rotate at positions other than their index (M-RoPE past a prompt's images: the index plus the
request's delta) holds each row's delta too, which moves with the row.
"""
import torch

from sluice.worker.ops.attention_metadata import AttentionMetadata, rows_per_program


def batch_size_ladder(max_batch_size: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch_size + 1, 16))
    return sorted({size for size in sizes if size <= max_batch_size} | {max_batch_size})


class DecodeGraphs:
    def __init__(self, model, kv_caches, cos_sin_cache: torch.Tensor, max_batch_size: int, max_blocks_per_seq: int,
                 device: torch.device, capture: bool = True):
        """capture False (the CPU): each replay runs the pass eagerly over the live rows, from the same buffers."""
        self.model = model
        self.kv_caches = kv_caches
        self.cos_sin_cache = cos_sin_cache
        attention = model.layers[0].self_attn
        self.ops = attention.ops
        self.max_group_rows = rows_per_program(attention.num_heads, attention.num_kv_heads)
        self.block_size = kv_caches[0][0].shape[1]
        self.sizes = batch_size_ladder(max_batch_size)
        n = max_batch_size
        self.shifts_positions = model.takes_images
        # input ids, next positions and, for shifts_positions, position deltas
        self.token_inputs = torch.zeros(3 if self.shifts_positions else 2, n, dtype=torch.int64, device=device)
        self.input_ids, self.next_positions = self.token_inputs[:2]
        self.position_deltas = self.token_inputs[2] if self.shifts_positions else None
        self.live = torch.zeros(n, dtype=torch.bool, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)  # these three: computed by each replay
        self.slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.row_groups = torch.ones(n, dtype=torch.int32, device=device)  # a verification's rows of one sequence
        self._grouped = False
        self.rows = torch.arange(n, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._num_live = 0
        if capture:
            self._capture_all()

    def _metadata(self, batch_size: int, max_seq_len: int | None) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:batch_size], query_start_loc=self.query_start_loc[:batch_size + 1],
            seq_lens=self.seq_lens[:batch_size], block_tables=self.block_tables[:batch_size],
            token_seq_index=self.rows[:batch_size], token_query_pos=torch.zeros_like(self.rows[:batch_size]),
            max_query_len=1, max_seq_len=max_seq_len or self.block_tables.shape[1] * self.block_size,
            row_groups=self.row_groups[:batch_size], max_group_rows=self.max_group_rows)

    def _forward(self, batch_size: int, max_seq_len: int | None = None) -> torch.Tensor:
        self.ops.decode_step_inputs(self.next_positions[:batch_size], self.live[:batch_size],
                                    self.block_tables[:batch_size], self.positions[:batch_size],
                                    self.slot_mapping[:batch_size], self.seq_lens[:batch_size], self.block_size)
        positions = self.positions[:batch_size]
        if self.shifts_positions:
            positions = positions + self.position_deltas[:batch_size]
        return self.model(self.input_ids[:batch_size], positions, self.cos_sin_cache, self.kv_caches,
                          self._metadata(batch_size, max_seq_len), None)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        for batch_size in reversed(self.sizes):  # the largest first, so smaller graphs reuse its memory pool
            self._forward(batch_size)  # warm-up: compiles the kernels outside the capture (no row is live)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[batch_size] = self._forward(batch_size)
            pool = graph.pool()
            self.graphs[batch_size] = graph

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def run(self, token_inputs: torch.Tensor, block_tables: torch.Tensor, max_seq_len: int,
            row_groups: torch.Tensor | None = None, position_deltas: torch.Tensor | None = None) -> torch.Tensor:
        """A step of n rows 0..n-1. token_inputs: [2, n] int64 input ids and positions; block_tables: [n, width]
        int32 (entries past a request's blocks, or past the longest context, are never read); row_groups: int32 [n]
        (AttentionMetadata's, of at most max_group_rows rows), None: each row alone; position_deltas: int64 [n], of
        a model that shifts positions (None: all 0)."""
        n = token_inputs.shape[1]
        width = min(block_tables.shape[1], self.block_tables.shape[1])
        self.token_inputs[:2, :n].copy_(token_inputs)
        if position_deltas is not None:
            self.position_deltas[:n].copy_(position_deltas)
        elif self.shifts_positions:
            self.position_deltas[:n].zero_()
        self.block_tables[:n, :width].copy_(block_tables[:, :width])
        if row_groups is not None:
            self.row_groups[:n].copy_(row_groups)
            self.row_groups[n:].fill_(1)
        elif self._grouped:
            self.row_groups.fill_(1)
        self._grouped = row_groups is not None
        self.keep_first(n)
        return self.replay(max_seq_len)

    def keep_first(self, n: int) -> None:
        """Rows 0..n-1 are the live ones."""
        if n != self._num_live:
            self.live[:n].fill_(True)
            self.live[n:].fill_(False)
            self._num_live = n

    def move_rows(self, rows: torch.Tensor) -> None:
        """The live rows `rows` (int64, on the device) move to rows 0..len(rows)-1, in that order, each a sequence
        of its own; the others stop being live."""
        n = rows.shape[0]
        self.token_inputs[:, :n] = self.token_inputs[:, rows]
        self.block_tables[:n] = self.block_tables[rows]
        if self._grouped:
            self.row_groups.fill_(1)
            self._grouped = False
        self.keep_first(n)

    def lay_out_verification(self, layout: torch.Tensor) -> None:
        """Rows 0..n-1 become a verification laid out as decode rows, from the live rows. layout: [4, n] int64 on the
        device, per new row: the live row whose request it continues, its offset past that row's next token (0 for
        the newest token, j for the j-th proposal), the proposal it takes as input (where the offset is not 0) and its
        row group (AttentionMetadata's)."""
        rows, offsets, proposed, groups = layout
        n = rows.shape[0]
        self.token_inputs[:, :n] = self.token_inputs[:, rows]
        self.input_ids[:n] = torch.where(offsets > 0, proposed, self.input_ids[:n])
        self.next_positions[:n] += offsets
        self.block_tables[:n] = self.block_tables[rows]
        self.row_groups[:n].copy_(groups)
        self.row_groups[n:].fill_(1)
        self._grouped = True
        self.keep_first(n)

    @property
    def num_live(self) -> int:
        return self._num_live

    def replay(self, max_seq_len: int) -> torch.Tensor:
        """The next step of the live rows, from what the buffers hold: [num_live, vocab] logits. max_seq_len bounds
        the rows' contexts for an uncaptured pass."""
        n = self._num_live
        if not self.graphs:
            return self._forward(n, max_seq_len)
        batch_size = next(size for size in self.sizes if size >= n)
        self.graphs[batch_size].replay()
        return self.logits[batch_size][:n]

    def set_blocks(self, rows: torch.Tensor, columns: torch.Tensor, block_ids: torch.Tensor) -> None:
        """Block table entries of live rows: their rows, columns and block ids (int32, on the device)."""
        self.block_tables.index_put_((rows, columns), block_ids)

    def feed(self, token_ids: torch.Tensor) -> None:
        """The live rows' sampled tokens become their next inputs."""
        self.input_ids[: token_ids.shape[0]].copy_(token_ids)
