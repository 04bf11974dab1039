"""Paged decode attention: one new query token per sequence against its whole cached context (flash-decoding).

The rows of a speculative verification (a request's newest token and its proposals) share one program, which reads
the context once for all of them. An FP8 cache is read as int32 words of four elements."""
import math

import torch
import triton
import triton.language as tl

from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs
from sluice.kernels.paged_kv import (attend_kv_range, attention_variant, check_paged_kv, dot_config, softmax_start,
                                     window_start_tile)
from sluice.kernels.prefill_attention import paged_prefill_attention_ref

MAX_SPLITS = 64
# NOTE: split until the grid has PROGRAMS_PER_SM programs per SM, with at least MIN_TOKENS_PER_SPLIT context tokens
# (one GPU tile) per split. H200, bf16, 16 q / 8 kv heads, head_dim 128, CUDA-graph times in us for num_splits
# 1/2/4/8/16/32 (benchmarks/kernel_timings.py): batch 1 ctx 1024: 21.8/14.3/9.4/6.9/5.9/6.5 (picks 16); batch 1 ctx 4096:
# 79.6/46.3/24.9/15.0/10.1/9.5 (picks 33); batch 8 ctx 4096: 112/68/44/39/41/42 (picks 5); batch 32 ctx 1024:
# 41.7/39.0/42.0/41.8/46.0/62.1 (picks 2); batch 64 ctx 1024: 65.9/72.3/75.7/... (picks 1); batch 64 and 256 at
# ctx 4096 are best unsplit (0.242 and 0.948 ms, 1.04-1.07x the copy bandwidth as they only read).
# 4 programs per SM would split batch 64 ctx 1024 in two, 10% slower.
MIN_TOKENS_PER_SPLIT = 64
PROGRAMS_PER_SM = 2


@triton.jit(do_not_specialize=["stride_bt"])  # the block table's width changes every eager step: compile once
def _paged_decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, sinks_ptr, block_tables_ptr, seq_lens_ptr,
    row_groups_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2,
    stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_vb, stride_vt, stride_vh,
    stride_bt,
    stride_os, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Program (row, kv_head, split) attends the GQA group of query heads sharing kv_head to one slice of the context.

    With ROWS > 1 the program's rows are row_groups[row] consecutive rows of one sequence (a verification's
    newest token and proposals, one position apart) and it returns at once for 0; their query heads share the tile
    (BLOCK_G >= ROWS * GROUP), so each K/V tile is read once for all of them. The context is cut into NUM_SPLITS
    slices of equal length of the first row's context (rounded up to whole BLOCK_N tiles; the last slices may be
    short or empty); the slice that holds the first row's last position also takes the later rows' newer positions.
    Each row's query rows (padded to BLOCK_G >= 16 for tl.dot) are loaded once, and each K/V tile, gathered through
    the block table, is read once for the whole group (attend_kv_range: online softmax in base 2, unmasked over
    whole tiles that every row sees, masked, causally per row, over the rest).
    With SLIDING_WINDOW the slices cut only the first row's window, from the tile holding its first position; no
    earlier position is read. With HAS_SINKS split 0 starts its softmax from the sinks, so they count once.
    With one split the normalised result goes straight to `out`; otherwise the split writes acc / l and its
    log-sum-exp m + log2(l) (-inf for an empty slice) for `_decode_reduce_kernel`.
    """
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_rows = 1
    if ROWS > 1:
        num_rows = tl.load(row_groups_ptr + row)
        if num_rows == 0:
            return

    # -- the group's query rows: [BLOCK_G, BLOCK_D], row r's GROUP heads at r * GROUP
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    rows = row + g // GROUP
    row_mask = g < num_rows * GROUP
    heads = kv_head * GROUP + g % GROUP
    q_mask = row_mask[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + rows[:, None] * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
    q = q.to(DOT_DTYPE)
    first_len = tl.load(seq_lens_ptr + row)
    row_lens = tl.load(seq_lens_ptr + rows, mask=row_mask, other=first_len)
    q_pos = row_lens - 1  # each row's new token is the last position it sees

    # -- this split's slice of the context (of its window's tiles)
    context_start = window_start_tile(first_len - 1, SLIDING_WINDOW, BLOCK_N)
    split_len = tl.cdiv(tl.cdiv(first_len - context_start, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = context_start + split * split_len
    end = tl.minimum(start + split_len, first_len)
    if (start < first_len) & (start + split_len >= first_len):
        end = tl.max(row_lens, 0)

    # -- whole tiles without masks, then the slice's ragged last tile (and the later rows' positions) with them
    acc, l, m = softmax_start(sinks_ptr, heads, split == 0, BLOCK_D, HAS_SINKS)
    k_ptr = k_cache_ptr + kv_head * stride_kh
    v_ptr = v_cache_ptr + kv_head * stride_vh
    bt_row = block_tables_ptr + row * stride_bt
    full_end = start + tl.maximum(tl.minimum(end, first_len) - start, 0) // BLOCK_N * BLOCK_N
    acc, l, m = attend_kv_range(
        acc, l, m, q, q_pos, first_len - 1, tl.max(q_pos, 0), k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, bt_row,
        start, full_end, end, scale_log2,
        stride_kb, stride_kt, stride_vb, stride_vt,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, DOT_DTYPE, DOT_PRECISION, KV_FP8, SLIDING_WINDOW, SOFTCAP)

    # -- write the result (an empty slice or seq_len == 0 gives zeros and lse -inf)
    nonempty = l > 0
    l = tl.where(nonempty, l, 1.0)
    o = acc / l[:, None]
    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + rows[:, None] * stride_os + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (rows * GROUP * tl.num_programs(1) + heads) * NUM_SPLITS + split  # [num_seqs, num_heads, NUM_SPLITS]
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + d[None, :], o, mask=q_mask)
        lse = tl.where(nonempty, m + tl.log2(l), float("-inf"))
        tl.store(part_lse_ptr + part, lse, mask=row_mask)


@triton.jit
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (seq, head) merges the splits: out = sum_i 2^(lse_i - max) * o_i / sum_i 2^(lse_i - max)."""
    wait_for_inputs(PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(part_lse_ptr + part + s, mask=s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # empty splits (lse -inf) weigh 0
    o_mask = (s < NUM_SPLITS)[:, None] & (d < HEAD_DIM)[None, :]
    o = tl.load(part_out_ptr + (part + s)[:, None] * HEAD_DIM + d[None, :], mask=o_mask, other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(o * w[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


def _default_num_splits(num_seqs: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """Enough splits to fill the GPU, but none shorter than MIN_TOKENS_PER_SPLIT; decided without a host sync."""
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    wanted = triton.cdiv(PROGRAMS_PER_SM * num_sms, max(num_seqs * num_kv_heads, 1))
    return max(1, min(wanted, triton.cdiv(max_context, MIN_TOKENS_PER_SPLIT), MAX_SPLITS))


def _launch_config(device: torch.device, kv_fp8: bool) -> dict:
    # NOTE: on CPU (interpreter) small tiles so small test contexts still cross several tiles and splits.
    if device.type != "cuda":
        return dict(BLOCK_N=16, num_warps=1, num_stages=1)
    # NOTE: H200, bf16, head_dim 128, sweep BLOCK_N {16,32,64,128} x warps {2,4,8} x stages {1,2,3} over batch/ctx
    # 1/4096, 64/1024, 64/4096, 256/4096 (eager timing, before the unmasked fast path): 64/4/2 totals 1.343 ms
    # (256/4096: 0.962 ms, the fastest), the best total (32/2/2) 1.339 ms; BLOCK_N 128 totals >= 1.391 ms and
    # BLOCK_N 16 1.458 ms.
    # An FP8 cache, read as words, moves half the bytes per tile: H100, CUDA graphs, 256 sequences of Llama-3.1-8B's
    # heads (32 q / 8 kv) with 1,000-2,000 tokens: BLOCK_N {64,128,256} x warps {4,8} at 2 stages take 308/461,
    # 295/379, 304/472 us, 128/4 at 3 stages 291 us (the bytes' loads: 349 us; a bf16 cache 537 us).
    # Capped at 168 registers a thread, three programs fit an SM. The decode graphs' launch, which may group a
    # verification's rows (ROWS > 1), took 184 and fitted two (H100, 400 sequences of 1,000-2,000 tokens at
    # Llama-3.1-8B's heads: 506.3 us uncapped, 445.6 capped, 434.9 one row a program; Qwen3-0.6B's 256 of
    # 100-1,500: 198.0, 174.1, 168.5).
    if kv_fp8:
        return dict(BLOCK_N=128, num_warps=4, num_stages=3, maxnreg=168)
    return dict(BLOCK_N=64, num_warps=4, num_stages=2)


def paged_decode_attention(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, num_splits: int | None = None, k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None, out: torch.Tensor | None = None, row_groups: torch.Tensor | None = None,
    max_group_rows: int = 1, pdl: bool = True, sliding_window: int = 0, softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context, into `out` (None: a new tensor) of the
    query's shape [num_seqs, num_heads, head_dim], whose last dimension is contiguous.

    query: [num_seqs, num_heads, head_dim]; seq_lens include the query token, whose K/V must already be cached.
    num_splits: context slices per sequence (flash-decoding); None picks one from the batch shape and the block
    table width (max_blocks_per_seq * block_size bounds the context), never from seq_lens, so no host sync.
    k_scale, v_scale: the float32 scales of FP8 caches (kernels.kv_quant); None for caches in the query's dtype.
    row_groups: int32 [num_seqs], for rows that are consecutive tokens of one sequence (the same block table row,
    contexts one position apart, as a verification of proposals lays them out): how many rows (at most
    max_group_rows) one program attends from the first of them, 0 for the others; None: every row alone.
    sliding_window, softcap, sinks: as paged_prefill_attention's; with a window, the splits cut only its positions.
    """
    kv_fp8 = check_paged_kv(query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale)
    variant = attention_variant(query, sliding_window, softcap, sinks)
    num_seqs, num_heads, head_dim = query.shape
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {num_seqs} queries")
    _, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    if num_splits is None:
        max_context = block_tables.shape[1] * block_size
        if sliding_window:
            max_context = min(max_context, sliding_window)
        num_splits = _default_num_splits(num_seqs, num_kv_heads, max_context, query.device)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits {num_splits} not in [1, {MAX_SPLITS}]")
    if row_groups is None:
        max_group_rows = 1
    elif row_groups.dtype != torch.int32 or row_groups.shape != (num_seqs,) or max_group_rows < 1:
        raise ValueError(f"row_groups must be int32 [{num_seqs}] with max_group_rows >= 1, got {row_groups.dtype} "
                         f"{tuple(row_groups.shape)} and {max_group_rows}")

    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out
    part_out = part_lse = out  # unused placeholders when the single split writes `out` itself
    if num_splits > 1:
        part_out = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    dot_dtype, dot_precision = dot_config(query.dtype, query.device, kv_fp8)
    block_d = triton.next_power_of_2(head_dim)
    if kv_fp8:  # read as int32 words of four elements (kernels.paged_kv._attend_kv_words)
        key_cache, value_cache = _words(key_cache), _words(value_cache)
    _paged_decode_attention_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, query if k_scale is None else k_scale, query if v_scale is None else v_scale,
        query if sinks is None else sinks, block_tables, seq_lens, seq_lens if row_groups is None else row_groups,
        out, part_out, part_lse,
        scale * math.log2(math.e),
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, NUM_SPLITS=num_splits, ROWS=max_group_rows,
        BLOCK_G=max(16, triton.next_power_of_2(max_group_rows * group)), BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype, DOT_PRECISION=dot_precision, KV_FP8=kv_fp8, **variant,
        **_launch_config(query.device, kv_fp8), **dependent_launch(query.device, pdl),
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
            **dependent_launch(query.device, pdl),
        )
    return out


def _words(cache: torch.Tensor) -> torch.Tensor:
    if cache.shape[-1] % 4:
        raise ValueError(f"an FP8 cache's head_dim must be a multiple of 4, got {cache.shape[-1]}")
    return cache.view(torch.int32)


def paged_decode_attention_ref(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, scale: float, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
    sliding_window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain torch: a decode step is a prefill chunk of one token per sequence."""
    query_start_loc = torch.arange(query.shape[0] + 1, dtype=torch.int32, device=query.device)
    return paged_prefill_attention_ref(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
                                       k_scale, v_scale, sliding_window, softcap, sinks)
