"""The operators in plain torch (TorchOps), aligned with transformers: the CPU path."""
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.ops.fp8 import FP8, to_fp8
from sluice.worker.ops.fp8_gemm import Fp8Gemm, emulated_block_fp8_linear, emulated_fp8_linear
from sluice.worker.ops.packed_linear import PackedLinear
from sluice.worker.ops.w4a16 import W4A16ExpertWeights, W4A16Linear


class TorchOps:
    """Plain-torch operators, numerically aligned with Hugging Face transformers. The CPU path. Linear layers are
    nn.Linear, packed_linear.PackedLinear (oneDNN), fp8.Fp8Linear (fp8_gemm computes them) or w4a16.W4A16Linear
    modules (dequantized, then multiplied, as kernels.w4a16_linear_ref does). KV caches are in the model dtype, or e4m3
    with a float32 k_scale / v_scale each (stored = x / scale, read back as stored * scale in float32)."""

    def __init__(self, fp8_gemm: Fp8Gemm = emulated_fp8_linear):
        self.fp8_gemm = fp8_gemm

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False) -> torch.Tensor:
        """Llama's RMSNorm (rounded to x's dtype, then times weight), or with gemma_norm Gemma's: x * (1 + weight),
        all in float32, rounded once to x's dtype."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        if gemma_norm:
            return (x32 * (1.0 + weight.float())).to(x.dtype)
        return weight * x32.to(x.dtype)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     gemma_norm: bool = False):
        residual = residual + x
        return self.rms_norm(residual, weight, eps, gemma_norm), residual

    def linear(self, x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
        if isinstance(layer, PackedLinear):
            return layer(x)
        if isinstance(layer, W4A16Linear):
            from sluice.kernels.w4a16 import w4a16_linear_ref  # imports Triton: only where a 4-bit model runs

            return w4a16_linear_ref(x, layer.w4a16, layer.bias)
        if layer.weight.dtype == FP8:
            return self.fp8_gemm(x, layer.weight, layer.weight_scale, layer.bias)
        return F.linear(x, layer.weight, layer.bias)

    def norm_linear(self, x, residual, norm_weight, eps, layer, gated=False, out_dtype=None, gemma_norm=False,
                    activation="silu"):
        """(linear(rmsnorm(x + residual)), x + residual), or with residual None (linear(rmsnorm(x)), x); the norm
        Gemma's with gemma_norm; `gated` applies act_and_mul(..., activation) to the projection, out_dtype converts
        the result."""
        if residual is None:
            h, residual = self.rms_norm(x, norm_weight, eps, gemma_norm), x
        else:
            h, residual = self.add_rms_norm(x, residual, norm_weight, eps, gemma_norm)
        y = self.linear(h, layer)
        if gated:
            y = self.act_and_mul(y, activation)
        return (y if out_dtype is None else y.to(out_dtype)), residual

    def prepare_qkv(self, qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, key_cache, value_cache,
                    slot_mapping, k_scale=None, v_scale=None, gemma_norm=False) -> torch.Tensor:
        # qkv: [num_tokens, num_heads + 2 * num_kv_heads, head_dim] -> q: [num_tokens, num_heads, head_dim]
        q, k, v = self.rotated_qkv(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps,
                                   key_cache.shape[2], gemma_norm)
        _store(key_cache, slot_mapping, k, k_scale)
        _store(value_cache, slot_mapping, v, v_scale)
        return q

    @classmethod
    def rotated_qkv(cls, qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, num_kv_heads: int,
                    gemma_norm: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v heads as attention takes them: q and k normed (with per-head norms, Gemma's with gemma_norm)
        and rotated in their first cos_sin_cache.shape[1] dims (all, or a partial rotary's)."""
        q, k, v = qkv.split([qkv.shape[1] - 2 * num_kv_heads, num_kv_heads, num_kv_heads], dim=1)
        if q_norm_weight is not None:
            q, k = cls.rms_norm(q, q_norm_weight, eps, gemma_norm), cls.rms_norm(k, k_norm_weight, eps, gemma_norm)
        cos, sin = cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
        """GeGLU: gelu(gate) * up, gelu's tanh approximation (transformers' gelu_pytorch_tanh)."""
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up

    def act_and_mul(self, x: torch.Tensor, activation: str) -> torch.Tensor:
        """The MLP gate of an activation of kernels.activation: silu_and_mul or gelu_tanh_and_mul."""
        return {"silu": self.silu_and_mul, "gelu_tanh": self.gelu_tanh_and_mul}[activation](x)

    @staticmethod
    def route_tokens(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's top_k experts by softmax probability: float32 weights [num_tokens, top_k] (divided by their
        sum where renormalize) and int32 expert ids."""
        probs = torch.softmax(router_logits, dim=-1, dtype=torch.float)
        weights, expert_ids = torch.topk(probs, top_k, dim=-1)
        if renormalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        return weights, expert_ids.to(torch.int32)

    @staticmethod
    def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
        """gpt-oss's experts' activation: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate,
        limit); gate_up: [..., 2 * intermediate], the gate's columns then the up's."""
        gate, up = gate_up.chunk(2, dim=-1)
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        return (up + 1) * (gate * torch.sigmoid(gate * alpha))

    def fused_experts(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, experts: nn.Module,
                      expert_map: torch.Tensor | None = None) -> torch.Tensor:
        """sum over k of weights[t, k] * expert(x[t]) for each token t, where expert e (experts.w13[i] and w2[i], i its
        local index: expert_map[e], or e without a map) computes down(silu(gate(x)) * up(x)); a pair whose expert maps
        to -1 (another rank holds it) adds nothing. Expert by expert, as transformers computes it; FP8 experts
        (models/moe.py) as the FP8 GEMMs compute a linear layer's product, 4-bit ones dequantized an expert at a
        time."""
        local = expert_ids.long() if expert_map is None else expert_map[expert_ids.long()].long()
        return self._expert_sum(x, weights.to(x.dtype), local, experts, TorchOps.silu_and_mul)

    def biased_experts(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, experts: nn.Module,
                       alpha: float, limit: float) -> torch.Tensor:
        """gpt-oss's experts, as transformers computes them: expert e computes
        w2[e] @ clamped_swiglu(w13[e] @ x + w13_bias[e]) + w2_bias[e], times its float32 routing weight; FP8 experts
        as fused_experts computes them, each bias added to the scaled product."""
        return self._expert_sum(x, weights, expert_ids.long(), experts,
                                partial(TorchOps.clamped_swiglu, alpha=alpha, limit=limit))

    def _expert_sum(self, x: torch.Tensor, weights: torch.Tensor, local: torch.Tensor, experts: nn.Module,
                    gated: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """sum over k of weights[t, k] * w2[e] @ gated(w13[e] @ x[t]) (with the experts' biases, where they have
        them), e = local[t, k] (-1: no local expert, nothing added), rounded to x's dtype expert by expert."""
        out = torch.zeros_like(x)
        for expert in torch.unique(local[local >= 0]).tolist():
            token, slot = torch.where(local == expert)
            gate_up = self._expert_product(x[token], _expert_weight(experts.w13, expert),
                                           _of(experts.w13_scale, expert), _of(experts.w13_bias, expert),
                                           experts.block_shape)
            down = self._expert_product(gated(gate_up), _expert_weight(experts.w2, expert),
                                        _of(experts.w2_scale, expert), _of(experts.w2_bias, expert),
                                        experts.block_shape)
            out.index_add_(0, token, (down * weights[token, slot, None]).to(x.dtype))
        return out

    def _expert_product(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                        bias: torch.Tensor | None, block_shape: tuple[int, int] | None) -> torch.Tensor:
        """x @ weight.T + bias for one expert's projection, an e4m3 one with its scale per row or per block, or a
        4-bit one's W4A16Weight."""
        if not isinstance(weight, torch.Tensor):
            from sluice.kernels.w4a16 import w4a16_linear_ref  # imports Triton: only where a 4-bit model runs

            return w4a16_linear_ref(x, weight, bias)
        if scale is None:
            return F.linear(x, weight, bias)
        if block_shape is None:
            return self.fp8_gemm(x, weight, scale, bias)
        product = emulated_block_fp8_linear(x, weight, scale, block_shape, self.fp8_gemm.absmax_bound)
        return product if bias is None else product + bias

    @staticmethod
    def decode_step_inputs(next_positions, live, block_tables, positions, slot_mapping, seq_lens,
                           block_size: int) -> None:
        """In place: one token per row at its next position (a padding row: position 0, slot -1, one token of
        context), then the live rows' next positions advance by one (kernels.decode_step_inputs)."""
        positions.copy_(torch.where(live, next_positions, 0))
        blocks = block_tables.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1).long()
        slot_mapping.copy_(torch.where(live, blocks * block_size + positions % block_size, -1))
        seq_lens.copy_(positions + 1)
        next_positions.add_(live)

    @staticmethod
    def attention(q, key_cache, value_cache, meta: AttentionMetadata, scale: float, k_scale=None, v_scale=None,
                  out=None, sliding_window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None):
        """Causal attention of the step's queries over their paged context, into `out` when given. sliding_window > 0:
        a query at position p reads the keys after p - sliding_window only; softcap > 0: scores become
        softcap * tanh(score / softcap); sinks: a float32 logit per query head that joins each softmax's denominator
        and adds no value (gpt-oss)."""
        # Pads the step's chunks into [num_seqs, max_query_len] queries against [num_seqs, max_seq_len] gathered keys;
        # a decode step's queries are one a sequence already.
        num_heads, head_dim = q.shape[1:]
        k, v = _context(key_cache, meta, k_scale, q.dtype), _context(value_cache, meta, v_scale, q.dtype)
        if meta.is_pure_decode:
            padded_q = q.view(meta.num_seqs, 1, num_heads, head_dim)
        else:
            padded_q = q.new_zeros(meta.num_seqs, meta.max_query_len, num_heads, head_dim)
            padded_q[meta.token_seq_index, meta.token_query_pos] = q
        query_lens = meta.query_start_loc[1:] - meta.query_start_loc[:-1]
        first_query_pos = (meta.seq_lens - query_lens).long()
        query_pos = first_query_pos[:, None] + torch.arange(meta.max_query_len)[None]  # [num_seqs, max_query_len]
        key_pos = torch.arange(meta.max_seq_len)[None, None]
        mask = key_pos <= query_pos[:, :, None]  # [num_seqs, max_query_len, max_seq_len]
        if sliding_window:
            mask &= key_pos > query_pos[:, :, None] - sliding_window
        padded_q = padded_q.transpose(1, 2)
        if meta.is_pure_decode or softcap or sinks is not None:
            attended = _explicit_attention(padded_q, k, v, mask, scale, softcap, sinks)
        else:
            attended = F.scaled_dot_product_attention(padded_q, k, v, attn_mask=mask[:, None], scale=scale,
                                                      enable_gqa=True)
        attended = attended.transpose(1, 2)
        attended = attended.view(q.shape) if meta.is_pure_decode else attended[meta.token_seq_index,
                                                                               meta.token_query_pos]
        return attended if out is None else out.copy_(attended)

    @staticmethod
    def segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
                          scale: float) -> torch.Tensor:
        """Attention among the rows of each segment [bounds[i], bounds[i + 1]) alone, in both directions (a vision
        tower's windows or image frames): q, k and v [num_rows, num_heads, head_dim], segment by segment as
        transformers' SDPA path computes it: [1, num_heads, rows, head_dim] each, the 4-D inputs that the fused
        kernels take (3-D ones fall back to scores written out, 64 GiB for one frame of 32,768 patches)."""
        lengths = bounds.diff().tolist()
        return torch.cat([F.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in segment), scale=scale)[0]
                          .transpose(0, 1) for segment in zip(q.split(lengths), k.split(lengths), v.split(lengths))])


def _explicit_attention(q, k, v, mask, scale: float, softcap: float, sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention with its scores written out, as transformers' eager attention computes soft-capping and sinks, each
    KV head's query heads in one product: q [seqs, heads, queries, dim], k and v [seqs, kv_heads, keys, dim], mask
    [seqs, queries, keys]. A decode step's one query a sequence takes this path too: it reads each key once for
    the group, where the CPU's flash attention kernel costs more than the product (and much more in bfloat16)."""
    seqs, heads, queries, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    grouped = q.reshape(seqs, kv_heads, group * queries, dim)
    scores = (torch.matmul(grouped, k.transpose(2, 3)) * scale).view(seqs, kv_heads, group, queries, -1)
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask[:, None, None], float("-inf"))
    if sinks is not None:
        sink_column = sinks.view(1, kv_heads, group, 1, 1).expand(*scores.shape[:-1], 1).to(scores.dtype)
        scores = torch.cat([scores, sink_column], dim=-1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs.view(seqs, kv_heads, group * queries, -1), v).view(seqs, heads, queries, dim)


def _expert_weight(weights: torch.Tensor | W4A16ExpertWeights, expert: int):
    """An expert's weight of a stack: a tensor, or a 4-bit stack's W4A16Weight."""
    return weights.w4a16.expert(expert) if isinstance(weights, W4A16ExpertWeights) else weights[expert]


def _of(stacked: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    """An expert's entry of a stacked tensor the experts may lack (scales, biases)."""
    return None if stacked is None else stacked[expert]


def _store(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale: torch.Tensor | None) -> None:
    """x's rows into the cache's slots, quantized for an FP8 cache (index_put_: the CPU has no FP8 index_copy_)."""
    block_size = cache.shape[1]
    cache[slots // block_size, slots % block_size] = x if scale is None else to_fp8(x, scale)


def _context(cache: torch.Tensor, meta: AttentionMetadata, scale: torch.Tensor | None,
             dtype: torch.dtype) -> torch.Tensor:
    """Every sequence's cached keys (or values), [num_seqs, num_kv_heads, max_seq_len, head_dim], gathered whole
    block by block in one copy from the cache's head-major storage (kv_cache.allocate_kv_cache), dequantized from
    an FP8 cache."""
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    tables = meta.block_tables[:, : -(-meta.max_seq_len // block_size)].long()
    # a block's positions of one KV head lie side by side: one row of [num_blocks * num_kv_heads, block_size,
    # head_dim], so that index_select copies whole rows (5x faster than indexing by block and head)
    rows = cache.transpose(1, 2).reshape(num_blocks * num_kv_heads, block_size, head_dim)
    row_ids = tables[:, None, :] * num_kv_heads + torch.arange(num_kv_heads)[None, :, None]
    context = rows.index_select(0, row_ids.flatten()).view(*row_ids.shape[:2], -1, head_dim)[:, :, : meta.max_seq_len]
    return context if scale is None else (context.float() * scale).to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x's first cos.shape[-1] dims rotated (rotate-half among them), its other dims as they are."""
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    rotated = (x_rot * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)
    return torch.cat([rotated, x_pass], -1) if x_pass.shape[-1] else rotated
