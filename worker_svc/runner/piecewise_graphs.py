"""CUDA graphs of the forward pass of steps that carry prefill chunks, captured in pieces per token-count bucket.

Attention depends on how a step's tokens divide into sequences, which no fixed graph holds; the rest of the pass
depends only on the number of tokens. So the pass over a bucket of n tokens is captured as a chain of graphs cut at
each layer's attention, which runs eagerly between two pieces over the step's real tokens, from one static query
buffer into one static output buffer. Padding rows write no KV (slot -1). All pieces of all buckets share one memory
pool: a chain replays in its capture order, and chains never interleave. Steps of more than MAX_CAPTURED_TOKENS run
eagerly: their device time hides their launch, and padding would only add to it.
"""
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sluice.worker.ops.attention_metadata import AttentionMetadata

MAX_CAPTURED_TOKENS = 512


def token_count_ladder(max_num_tokens: int) -> list[int]:
    """Bucket sizes up to max_num_tokens (at most MAX_CAPTURED_TOKENS), every 16 tokens to 256, then every 64."""
    largest = min(max_num_tokens, MAX_CAPTURED_TOKENS)
    sizes = [8, *range(16, 257, 16), *range(320, MAX_CAPTURED_TOKENS + 1, 64)]
    return sorted({size for size in sizes if size <= largest} | {largest})


@dataclass(slots=True)
class _LayerAttention:
    """A layer's attention arguments besides its query and the step's metadata."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    scale: float
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    variant: dict  # sliding_window, softcap, sinks: as the layer passes them (ops.attention)


class PiecewiseGraphs:
    def __init__(self, model, kv_caches, cos_sin_cache: torch.Tensor, max_num_tokens: int, device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.cos_sin_cache = cos_sin_cache
        attention = model.layers[0].self_attn
        self.ops = attention.ops
        self.attention = self.ops.attention  # the eager attention that runs between pieces
        self.sizes = token_count_ladder(max_num_tokens)
        n, dtype = self.sizes[-1], model.dtype
        self.token_inputs = torch.zeros(3, n, dtype=torch.int64, device=device)  # input ids, positions, KV slots
        self.input_ids, self.positions, self.slot_mapping = self.token_inputs
        self.slot_mapping.fill_(-1)
        self.query = torch.zeros(n, attention.num_heads, attention.head_dim, dtype=dtype, device=device)
        self.attended = torch.zeros_like(self.query)
        # the last layer's output, residual
        self.hidden = torch.zeros(2, n, model.config.hidden_size, dtype=dtype, device=device)
        self.layers: list[_LayerAttention] = []
        self.chains: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self._capture_all()

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        for size in reversed(self.sizes):  # the largest first, so smaller pieces reuse its memory
            self._pass(size, None)  # warm-up: compiles the kernels outside the capture
            torch.cuda.synchronize()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.chains[size] = self._pass(size, pool)
            torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()

    def _pass(self, num_tokens: int, pool) -> list[torch.cuda.CUDAGraph] | None:
        """One pass over the static inputs' first num_tokens rows; with a pool, captured as a chain of pieces."""
        meta = self._metadata(num_tokens)
        chain = None if pool is None else [_begun_graph(pool)]
        with self._cut_at_attention(num_tokens, chain, pool):
            x, residual = self.model.hidden_states(self.input_ids[:num_tokens], self.positions[:num_tokens],
                                                   self.cos_sin_cache, self.kv_caches, meta, None)
            self.hidden[0, :num_tokens].copy_(x)
            self.hidden[1, :num_tokens].copy_(residual)
        if chain is not None:
            chain[-1].capture_end()
        return chain

    @contextmanager
    def _cut_at_attention(self, num_tokens: int, chain: list[torch.cuda.CUDAGraph] | None, pool):
        """Stands in for ops.attention during a pass: the query goes to the static buffer, the piece under capture
        ends and the next one begins, and the static output buffer stands for attention's result."""
        layers = []

        def cut(q, key_cache, value_cache, meta, scale, k_scale=None, v_scale=None, **variant):
            layers.append(_LayerAttention(key_cache, value_cache, scale, k_scale, v_scale, variant))
            self.query[:num_tokens].copy_(q)
            if chain is not None:
                chain[-1].capture_end()
                chain.append(_begun_graph(pool))
            return self.attended[:num_tokens]

        self.ops.attention = cut
        try:
            yield
        finally:
            del self.ops.attention
        self.layers = layers

    def _metadata(self, num_tokens: int) -> AttentionMetadata:
        """The slots a pass writes its KV to (the rest is never read: attention is cut out)."""
        device = self.token_inputs.device
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=device),
            seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
            block_tables=torch.zeros(1, 1, dtype=torch.int32, device=device),
            token_seq_index=torch.zeros(num_tokens, dtype=torch.int64, device=device),
            token_query_pos=torch.arange(num_tokens, device=device), max_query_len=num_tokens, max_seq_len=num_tokens)

    def fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.sizes[-1]

    def run(self, token_inputs: torch.Tensor, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's output and residual at every token of the step; token_inputs: [3, num_tokens] int64
        input ids, positions and KV slots, which meta describes."""
        num_tokens = token_inputs.shape[1]
        size = next(size for size in self.sizes if size >= num_tokens)
        self.token_inputs[:, :num_tokens].copy_(token_inputs)
        self.slot_mapping[num_tokens:size].fill_(-1)
        first, *pieces = self.chains[size]
        first.replay()
        query, attended = self.query[:num_tokens], self.attended[:num_tokens]
        for layer, piece in zip(self.layers, pieces):
            self.attention(query, layer.key_cache, layer.value_cache, meta, layer.scale, layer.k_scale,
                           layer.v_scale, out=attended, **layer.variant)
            piece.replay()
        return self.hidden[0, :num_tokens], self.hidden[1, :num_tokens]


def _begun_graph(pool) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(pool=pool)
    return graph
