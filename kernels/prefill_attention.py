"""Paged prefill attention: causal attention of variable-length query chunks over their cached context."""
import math

import torch
import triton
import triton.language as tl

from sluice.kernels.kv_quant import from_cache_element_ref
from sluice.kernels.paged_kv import (attend_kv_range, attention_variant, check_paged_kv, dot_config, softmax_start,
                                     window_start_tile)


@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])  # they change every step: compile once
def _paged_prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, sinks_ptr, out_ptr, block_tables_ptr,
    query_start_loc_ptr, seq_lens_ptr,
    scale_log2, num_seqs,
    stride_qt, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Program (tile, kv_head) runs flash attention for BLOCK_Q query tokens x the GQA group sharing kv_head.

    Tiles are numbered without knowing the longest chunk on the host: sequence i owns tiles
    [query_start_loc[i] // BLOCK_Q + i, ...), so cdiv(total_q, BLOCK_Q) + num_seqs programs cover every chunk and a
    binary search over query_start_loc maps a program to its sequence; surplus programs exit at once.
    The tile packs token-major rows (token t, head h) -> row t * GROUP + h, so each K/V tile, gathered through the
    block table, is read once for the whole group; BLOCK_Q = BLOCK_M // GROUP and rows past BLOCK_Q * GROUP idle.
    A chunk is the last q_len tokens of a context of seq_len, so chunk token t sits at absolute position
    seq_len - q_len + t and sees keys at positions <= that (the cached prefix and the causal part of the chunk).
    attend_kv_range runs the online softmax: unmasked over the KV tiles that end before the tile's first query
    position, causally masked from there to the tile's last one. Every row sees position 0, so no row is all -inf.
    With SLIDING_WINDOW the loop starts at the tile holding the first query's first window position, and the tiles
    that some rows' windows leave out are masked too (each row sees at least itself).
    """
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # -- find the sequence owning this tile: the last i with query_start_loc[i] // BLOCK_Q + i <= pid
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], num_seqs, tl.int32)
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix_len = seq_len - q_len

    # -- the tile's query rows: [BLOCK_M, BLOCK_D]
    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    tok = tile * BLOCK_Q + r // GROUP
    heads = kv_head * GROUP + r % GROUP
    row_mask = (r < BLOCK_Q * GROUP) & (tok < q_len)
    q_offs = (q_start + tok)[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)
    q_pos = prefix_len + tok

    # -- KV tiles ending before the tile's first query position are seen whole by every row; the rest are masked
    acc, l, m = softmax_start(sinks_ptr, heads, True, BLOCK_D, HAS_SINKS)
    k_ptr = k_cache_ptr + kv_head * stride_kh
    v_ptr = v_cache_ptr + kv_head * stride_vh
    bt_row = block_tables_ptr + seq * stride_bt
    first_q_pos = prefix_len + tile * BLOCK_Q
    full_end = first_q_pos // BLOCK_N * BLOCK_N
    kv_end = prefix_len + tl.minimum((tile + 1) * BLOCK_Q, q_len)  # one past the tile's last query position
    acc, l, m = attend_kv_range(
        acc, l, m, q, q_pos, first_q_pos, kv_end - 1, k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, bt_row,
        window_start_tile(first_q_pos, SLIDING_WINDOW, BLOCK_N), full_end, kv_end, scale_log2,
        stride_kb, stride_kt, stride_vb, stride_vt,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, DOT_DTYPE, DOT_PRECISION, KV_FP8, SLIDING_WINDOW, SOFTCAP)

    # -- normalise and write the valid rows
    o = acc / l[:, None]
    o_offs = (q_start + tok)[:, None].to(tl.int64) * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


def _launch_config(device: torch.device, head_dim: int, element_size: int) -> dict:
    # NOTE: on CPU (interpreter) small tiles so small test chunks still cross several query and KV tiles.
    if device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=1, num_stages=1)
    # NOTE: H200, bf16, 16 q / 8 kv heads, head_dim 128, benchmarks/kernel_timings.py prefill cases (1x4096, 4x2048 fresh;
    # 8x512 after 3584 cached), sweep BLOCK_M {64,128} x BLOCK_N {32,64,128} x warps {4,8} x stages {2,3}
    # (eager timing): 128/128/8/2 was best or within 2% everywhere: 0.252 / 0.253 / 0.396 ms, against
    # 0.297 / 0.300 / 0.504 ms for 128/64/8/2. In CUDA graphs it runs 0.247 / 0.249 / 0.387 ms
    # (278 / 277 / 333 causal TFLOP/s); torch's dense, unpaged causal SDPA takes 0.153 / 0.152 ms on the fresh ones.
    # head_dim 64 takes 4 warps by analogy, unmeasured. Rows wider than 256 bytes (fp32, or head_dim > 128) take
    # BLOCK_N 64: fp32 at 128/128/2 stages ran out of shared memory on the H200; 128/64 fits (tested).
    block_n = 128 if head_dim * element_size <= 256 else 64
    return dict(BLOCK_M=128, BLOCK_N=block_n, num_warps=8 if head_dim > 64 else 4, num_stages=2)


def paged_prefill_attention(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, out: torch.Tensor | None = None, sliding_window: int = 0,
    softcap: float = 0.0, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of query chunks over their paged context, into `out` (None: a new tensor) of the query's
    shape [total_q_tokens, num_heads, head_dim], whose last dimension is contiguous.

    query: [total_q_tokens, num_heads, head_dim], sequence i's chunk is rows query_start_loc[i]:query_start_loc[i+1]
    and holds the last q_len tokens of its context of seq_lens[i] tokens, whose K/V (the chunk's too) are cached.
    k_scale, v_scale: the float32 scales of FP8 caches (kernels.kv_quant); None for caches in the query's dtype.
    sliding_window > 0: the query at position p sees positions after p - sliding_window only, and no block wholly
    before the chunk's first window is read; softcap > 0: scores s become softcap * tanh(s / softcap); sinks: float32
    [num_heads], each head's logit that joins its softmax's denominator with no value (kernels.paged_kv).
    """
    kv_fp8 = check_paged_kv(query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale)
    variant = attention_variant(query, sliding_window, softcap, sinks)
    num_seqs = block_tables.shape[0]
    if query_start_loc.dtype != torch.int32 or query_start_loc.shape != (num_seqs + 1,) \
            or not query_start_loc.is_contiguous() or query_start_loc.device != query.device:
        raise ValueError(f"query_start_loc must be contiguous int32 [{num_seqs + 1}] on {query.device}, got "
                         f"{query_start_loc.dtype} {tuple(query_start_loc.shape)} on {query_start_loc.device}")
    total_q, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads

    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if total_q == 0 or num_seqs == 0:
        return out
    config = _launch_config(query.device, head_dim, query.element_size())
    block_m = max(config.pop("BLOCK_M"), triton.next_power_of_2(group))
    block_q = block_m // group
    dot_dtype, dot_precision = dot_config(query.dtype, query.device, kv_fp8)
    _paged_prefill_attention_kernel[(triton.cdiv(total_q, block_q) + num_seqs, num_kv_heads)](
        query, key_cache, value_cache, query if k_scale is None else k_scale, query if v_scale is None else v_scale,
        query if sinks is None else sinks, out, block_tables, query_start_loc, seq_lens,
        scale * math.log2(math.e), num_seqs,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_D=triton.next_power_of_2(head_dim),
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, KV_FP8=kv_fp8, **variant, **config,
    )
    return out


def paged_prefill_attention_ref(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, sliding_window: int = 0, softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch, one sequence at a time, in fp32: gather the context through the block table (FP8 caches
    multiplied by their scales) from the first query's first window position on, soft-cap, mask, softmax with the
    sinks as one more column."""
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    group = query.shape[1] // num_kv_heads
    out = torch.empty_like(query)
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        q = query[starts[i]:starts[i + 1]].float()  # [q_len, num_heads, head_dim]
        q_len = q.shape[0]
        if q_len == 0:
            continue
        first = max(seq_len - q_len - sliding_window + 1, 0) if sliding_window else 0  # the first position seen
        blocks = block_tables[i, first // block_size:triton.cdiv(seq_len, block_size)].long()
        context = slice(first % block_size, seq_len - first // block_size * block_size)  # of the gathered blocks
        k = from_cache_element_ref(key_cache[blocks].reshape(-1, num_kv_heads, head_dim)[context], k_scale)
        v = from_cache_element_ref(value_cache[blocks].reshape(-1, num_kv_heads, head_dim)[context], v_scale)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [keys, num_heads, head_dim]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if softcap:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        key_pos = torch.arange(first, seq_len, device=q.device)[None, :]
        visible = key_pos <= q_pos  # [q_len, keys]
        if sliding_window:
            visible &= key_pos > q_pos - sliding_window
        scores = scores.masked_fill(~visible, float("-inf"))
        if sinks is not None:
            scores = torch.cat([scores, sinks.float()[:, None, None].expand(-1, q_len, 1)], dim=-1)
        probs = scores.softmax(dim=-1)[..., :k.shape[0]]
        out[starts[i]:starts[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out
