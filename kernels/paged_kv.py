"""Shared by both attention kernels: the online-softmax loop over paged K/V tiles, and the launcher checks.

Layout (per layer): key_cache and value_cache are [num_blocks, block_size, num_kv_heads, head_dim]; a token's slot
id is block_id * block_size + offset; block_tables is int32 [num_seqs, max_blocks_per_seq], padded with 0. The caches
are in the query's dtype, or FP8 with a float32 scale each (kernels.kv_quant). FP8 elements go into float16 dots as
they load, the k scale multiplying the scores and the v scale the probabilities.

Variants, each a constexpr that compiles its own kernel (the default compiles none of their code): SLIDING_WINDOW > 0
lets the query at position p see positions j with p - SLIDING_WINDOW < j <= p only (Hugging Face's sliding_window),
and no tile wholly before a query's window is read, so a window's expired blocks may hold anything; SOFTCAP > 0 turns
each score s = (q·k) * scale into SOFTCAP * tanh(s / SOFTCAP) before masking (Gemma 2); HAS_SINKS adds a learned logit
per query head to each softmax's denominator, with no value (gpt-oss).
"""
import math

import torch
import triton
import triton.language as tl

from sluice.kernels.kv_quant import check_kv_scales, load_scale

ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = tl.constexpr(math.log2(math.e))


@triton.jit
def _kv_tile_offsets(block_table_row_ptr, pos, valid, BLOCK_SIZE: tl.constexpr, stride_block, stride_slot):
    """Element offsets (int64) of the cache rows holding context positions `pos` of one sequence."""
    block_ids = tl.load(block_table_row_ptr + pos // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    return block_ids * stride_block + (pos % BLOCK_SIZE) * stride_slot


@triton.jit
def window_start_tile(first_q_pos, SLIDING_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """The first position of the first BLOCK_N tile that the query at first_q_pos sees: the tile holding
    first_q_pos - SLIDING_WINDOW + 1, or 0 without a window."""
    if SLIDING_WINDOW > 0:
        return tl.maximum(first_q_pos - SLIDING_WINDOW + 1, 0) // BLOCK_N * BLOCK_N
    return 0


@triton.jit
def softmax_start(sinks_ptr, heads, with_sink, BLOCK_D: tl.constexpr, HAS_SINKS: tl.constexpr):
    """The online softmax's (acc, l, m) before any position, for query rows of `heads`: empty, or with HAS_SINKS
    (where with_sink) holding each head's sink logit as a score whose value is zero."""
    m = tl.full(heads.shape, float("-inf"), tl.float32)
    l = tl.zeros(heads.shape, tl.float32)
    if HAS_SINKS:
        m = tl.where(with_sink, tl.load(sinks_ptr + heads) * LOG2E, m)
        l = tl.where(with_sink, 1.0, l)
    return tl.zeros([heads.shape[0], BLOCK_D], tl.float32), l, m


@triton.jit
def attend_kv_range(
    acc, l, m, q, q_pos, first_q_pos, last_q_pos,
    k_ptr, v_ptr, k_scale_ptr, v_scale_ptr, block_table_row_ptr, start, full_end, end, scale_log2,
    stride_kb, stride_kt, stride_vb, stride_vt,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Online-softmax attention of q to context positions [start, end): the whole tiles of [start, full_end), which
    every row sees in full, on the unmasked fast path, then [full_end, end) masked (see _attend_kv_tiles). With
    KV_FP8 the elements go to the dot as they are, and the scales at k_scale_ptr / v_scale_ptr multiply the scores
    and the probabilities instead (q·(k·s) = (q·k)·s, p·(v·s) = (p·s)·v): a tile's [R, BLOCK_N] values rather than
    its [BLOCK_N, BLOCK_D] elements. FP8 caches may come as int32 words of four elements (k_ptr / v_ptr and their
    strides in words): see _attend_kv_words.
    With SLIDING_WINDOW, start is the tile holding the first row's (first_q_pos's) first window position, and no
    earlier position is read; the tiles before the last row's (last_q_pos's) first window position, which some rows'
    windows leave out in part, take the masked path too."""
    score_scale = scale_log2 * load_scale(k_scale_ptr, KV_FP8)
    if SOFTCAP > 0:  # _scores takes 2^(dot * score_scale) = e^(-2 s / SOFTCAP)
        score_scale = score_scale * (-2.0 / SOFTCAP)
    v_scale = load_scale(v_scale_ptr, KV_FP8)
    window_lo = 0
    if SLIDING_WINDOW > 0:
        window_lo = first_q_pos - SLIDING_WINDOW + 1
        seen_by_all = last_q_pos - SLIDING_WINDOW + 1
        full_start = tl.minimum(start + tl.cdiv(tl.maximum(seen_by_all - start, 0), BLOCK_N) * BLOCK_N, full_end)
        acc, l, m = _attend_kv_tiles(
            acc, l, m, q, q_pos, k_ptr, v_ptr, v_scale, block_table_row_ptr, window_lo, start, full_start,
            score_scale, stride_kb, stride_kt, stride_vb, stride_vt,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, True, DOT_DTYPE, DOT_PRECISION, KV_FP8, SLIDING_WINDOW, SOFTCAP)
        start = full_start
    acc, l, m = _attend_kv_tiles(
        acc, l, m, q, q_pos, k_ptr, v_ptr, v_scale, block_table_row_ptr, window_lo, start, full_end, score_scale,
        stride_kb, stride_kt, stride_vb, stride_vt,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, False, DOT_DTYPE, DOT_PRECISION, KV_FP8, SLIDING_WINDOW, SOFTCAP)
    return _attend_kv_tiles(
        acc, l, m, q, q_pos, k_ptr, v_ptr, v_scale, block_table_row_ptr, window_lo, full_end, end, score_scale,
        stride_kb, stride_kt, stride_vb, stride_vt,
        HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, True, DOT_DTYPE, DOT_PRECISION, KV_FP8, SLIDING_WINDOW, SOFTCAP)


@triton.jit
def _attend_kv_tiles(
    acc, l, m, q, q_pos,
    k_ptr, v_ptr, v_scale, block_table_row_ptr, window_lo, start, end, score_scale,
    stride_kb, stride_kt, stride_vb, stride_vt,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, KV_FP8: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """Online-softmax attention of query rows q [R, BLOCK_D] to one sequence's context positions [start, end).

    K/V tiles of BLOCK_N positions are gathered through the block table (k_ptr / v_ptr already point at the
    kv head). Scores are in base 2 (score_scale = scale * log2(e), times an FP8 cache's k scale; v_scale multiplies
    the probabilities); (acc, l, m) is the running unnormalised output, sum and row max, returned updated.
    MASKED=False is the fast path for whole tiles that every row sees in full; MASKED=True masks positions >= end
    and, causally, positions > q_pos[row], and with SLIDING_WINDOW the positions before each row's window, reading
    none before window_lo. Without a window, callers guarantee that each row sees at least one position in the first
    tile it processes, so m is finite afterwards and exp2(-inf - m) = 0; with one, a row may see nothing of a
    masked tile and keeps m = -inf (_softmax_update). An FP8 cache read as int32 words goes through
    _attend_kv_words.
    """
    if k_ptr.dtype.element_ty == tl.int32:
        return _attend_kv_words(
            acc, l, m, q, q_pos, k_ptr, v_ptr, v_scale, block_table_row_ptr, window_lo, start, end, score_scale,
            stride_kb, stride_kt, stride_vb, stride_vt,
            HEAD_DIM, BLOCK_SIZE, BLOCK_N, BLOCK_D, MASKED, DOT_DTYPE, DOT_PRECISION, SLIDING_WINDOW, SOFTCAP)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    for tile_start in range(start, end, BLOCK_N):
        pos, valid = _tile_positions(tile_start, window_lo, end, BLOCK_N, MASKED, SLIDING_WINDOW)
        k = _load_tile(k_ptr, block_table_row_ptr, pos, valid, d, d_mask, stride_kb, stride_kt, BLOCK_SIZE, MASKED)
        s = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION)  # [R, BLOCK_N]
        s = _scores(s, pos, valid, q_pos, score_scale, MASKED, SLIDING_WINDOW, SOFTCAP)
        p, alpha, l, m = _softmax_update(s, l, m, MASKED and SLIDING_WINDOW > 0)
        v = _load_tile(v_ptr, block_table_row_ptr, pos, valid, d, d_mask, stride_vb, stride_vt, BLOCK_SIZE, MASKED)
        if KV_FP8:
            p_v = (p * v_scale).to(DOT_DTYPE)
        else:
            p_v = p.to(DOT_DTYPE)
        acc = acc * alpha[:, None] + tl.dot(p_v, v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return acc, l, m


@triton.jit
def _tile_positions(tile_start, window_lo, end, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
                    SLIDING_WINDOW: tl.constexpr):
    """A tile's context positions and which of them to read: those before end, and in a window's masked tiles only
    those from window_lo."""
    pos = tile_start + tl.arange(0, BLOCK_N)
    valid = pos < end
    if MASKED and SLIDING_WINDOW > 0:
        valid = valid & (pos >= window_lo)
    return pos, valid


@triton.jit
def _load_tile(ptr, block_table_row_ptr, pos, valid, columns, column_mask, stride_block, stride_slot,
               BLOCK_SIZE: tl.constexpr, MASKED: tl.constexpr):
    """The K or V tile [BLOCK_N, len(columns)] of context positions pos, gathered through the block table (ptr
    already points at the kv head); unmasked whole tiles mask only the columns past the head."""
    if MASKED:
        mask = valid[:, None] & column_mask[None, :]
    else:
        mask = column_mask[None, :]
    rows = _kv_tile_offsets(block_table_row_ptr, pos, valid, BLOCK_SIZE, stride_block, stride_slot)
    return tl.load(ptr + rows[:, None] + columns[None, :], mask=mask, other=0.0)


@triton.jit
def _scores(dots, pos, valid, q_pos, score_scale, MASKED: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
            SOFTCAP: tl.constexpr):
    """A tile's scores in base 2 from its dot products [R, BLOCK_N]: scaled; with SOFTCAP soft-capped,
    SOFTCAP * tanh(s / SOFTCAP) with tanh(x) = 2 / (1 + e^(-2x)) - 1 (the interpreter has no tanh; this one saturates
    without overflow); and when MASKED, -inf where the row does not see the position: not valid, after the row's
    own, or before its window."""
    if SOFTCAP > 0:
        s = (2.0 / (1.0 + tl.exp2(dots * score_scale)) - 1.0) * (SOFTCAP * LOG2E)
    else:
        s = dots * score_scale
    if MASKED:
        seen = (pos[None, :] <= q_pos[:, None]) & valid[None, :]
        if SLIDING_WINDOW > 0:
            seen = seen & (pos[None, :] > q_pos[:, None] - SLIDING_WINDOW)
        s = tl.where(seen, s, float("-inf"))
    return s


@triton.jit
def _softmax_update(s, l, m, MAY_SEE_NONE: tl.constexpr):
    """One tile's scores s [R, BLOCK_N] into the running sum l and max m: (p, alpha, l, m) with p = 2^(s - m) and
    alpha the factor that rescales what was accumulated before. MAY_SEE_NONE: rows that have seen no position yet
    (m = -inf) take p = alpha = 0 rather than exp2(-inf - -inf)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = m_new
    if MAY_SEE_NONE:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    return p, alpha, l * alpha + tl.sum(p, 1), m_new


@triton.jit
def _attend_kv_words(
    acc, l, m, q, q_pos,
    k_ptr, v_ptr, v_scale, block_table_row_ptr, window_lo, start, end, score_scale,
    stride_kb, stride_kt, stride_vb, stride_vt,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr, SOFTCAP: tl.constexpr,
):
    """_attend_kv_tiles over an FP8 cache read as int32 words of four e4m3 elements (element d = 4 * word + byte):
    loaded as bytes, a tile's 128-byte rows went in narrower loads and read at about 2.2 TB/s of an H100's 3.35,
    as words at 2.7 (BENCHMARKS.md). Byte plane i of a tile ([BLOCK_N, BLOCK_D / 4]) meets plane i of
    q in the score dot and feeds plane i of acc; q and acc are split into planes here and joined back."""
    w = tl.arange(0, BLOCK_D // 4)
    w_mask = w < HEAD_DIM // 4
    q0, q1, q2, q3 = _planes(q.to(DOT_DTYPE))
    a0, a1, a2, a3 = _planes(acc)
    for tile_start in range(start, end, BLOCK_N):
        pos, valid = _tile_positions(tile_start, window_lo, end, BLOCK_N, MASKED, SLIDING_WINDOW)
        k = _load_tile(k_ptr, block_table_row_ptr, pos, valid, w, w_mask, stride_kb, stride_kt, BLOCK_SIZE, MASKED)
        s = tl.dot(q0, tl.trans(_byte_plane(k, 0, DOT_DTYPE)), input_precision=DOT_PRECISION)
        s = tl.dot(q1, tl.trans(_byte_plane(k, 1, DOT_DTYPE)), s, input_precision=DOT_PRECISION)
        s = tl.dot(q2, tl.trans(_byte_plane(k, 2, DOT_DTYPE)), s, input_precision=DOT_PRECISION)
        s = tl.dot(q3, tl.trans(_byte_plane(k, 3, DOT_DTYPE)), s, input_precision=DOT_PRECISION)
        s = _scores(s, pos, valid, q_pos, score_scale, MASKED, SLIDING_WINDOW, SOFTCAP)
        p, alpha, l, m = _softmax_update(s, l, m, MASKED and SLIDING_WINDOW > 0)
        v = _load_tile(v_ptr, block_table_row_ptr, pos, valid, w, w_mask, stride_vb, stride_vt, BLOCK_SIZE, MASKED)
        p_v = (p * v_scale).to(DOT_DTYPE)
        a0 = tl.dot(p_v, _byte_plane(v, 0, DOT_DTYPE), a0 * alpha[:, None], input_precision=DOT_PRECISION)
        a1 = tl.dot(p_v, _byte_plane(v, 1, DOT_DTYPE), a1 * alpha[:, None], input_precision=DOT_PRECISION)
        a2 = tl.dot(p_v, _byte_plane(v, 2, DOT_DTYPE), a2 * alpha[:, None], input_precision=DOT_PRECISION)
        a3 = tl.dot(p_v, _byte_plane(v, 3, DOT_DTYPE), a3 * alpha[:, None], input_precision=DOT_PRECISION)
    return tl.join(tl.join(a0, a2), tl.join(a1, a3)).reshape(acc.shape), l, m


@triton.jit
def _planes(x):
    """x [R, D] as four [R, D / 4]: plane i holds the elements 4 * j + i."""
    even, odd = tl.split(x.reshape(x.shape[0], x.shape[1] // 4, 2, 2))
    p0, p2 = tl.split(even)
    p1, p3 = tl.split(odd)
    return p0, p1, p2, p3


@triton.jit
def _byte_plane(words, i: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Byte i of each int32 word, an e4m3 element, in DOT_DTYPE."""
    return ((words >> (8 * i)) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)


def dot_config(dtype: torch.dtype, device: torch.device, kv_fp8: bool) -> tuple[tl.dtype, str]:
    """The dtype tl.dot multiplies in and its fp32 precision mode.

    NOTE: the Triton interpreter (CPU) runs tl.dot on bfloat16's raw bit patterns (triton-lang/triton#11584,
    "not supported yet"), so off CUDA every dot runs in fp32. On CUDA, 16-bit inputs go to the tensor cores as they
    are and fp32 inputs use exact "ieee" products rather than the default tf32. Over an FP8 cache the dots run in
    float16, which e4m3 converts to in one instruction per pair of elements (bfloat16 takes several; H200, 142
    sequences of 1,100 tokens: bf16 dots over an FP8 cache ran 0.96x the bf16 cache's time, float16 dots 0.77x).
    """
    if device.type != "cuda" or dtype == torch.float32:
        return tl.float32, "ieee"
    return (tl.bfloat16 if dtype == torch.bfloat16 and not kv_fp8 else tl.float16), "tf32"


def attention_variant(query: torch.Tensor, sliding_window: int, softcap: float,
                      sinks: torch.Tensor | None) -> dict:
    """The kernels' variant constexprs (SLIDING_WINDOW, SOFTCAP, HAS_SINKS) of the launchers' options, checked:
    sliding_window and softcap >= 0 (0: none), sinks None or a contiguous float32 [num_heads] on the query's device."""
    if sliding_window < 0 or softcap < 0:
        raise ValueError(f"sliding_window {sliding_window} and softcap {softcap} must be >= 0 (0: none)")
    if sinks is not None and (sinks.dtype != torch.float32 or sinks.shape != query.shape[1:2]
                              or not sinks.is_contiguous() or sinks.device != query.device):
        raise ValueError(f"sinks must be contiguous float32 [{query.shape[1]}] on {query.device}, got {sinks.dtype} "
                         f"{tuple(sinks.shape)} on {sinks.device}")
    return dict(SLIDING_WINDOW=int(sliding_window), SOFTCAP=float(softcap), HAS_SINKS=sinks is not None)


def check_paged_kv(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
) -> bool:
    """Validate what both attention launchers share: dtypes, scales, devices, head counts and the cache layout;
    returns whether the caches are FP8."""
    if query.dtype not in ATTENTION_DTYPES:
        raise TypeError(f"query dtype {query.dtype} not in {ATTENTION_DTYPES}")
    is_fp8 = check_kv_scales(query.dtype, key_cache, value_cache, k_scale, v_scale)
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"key/value cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
                         f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    _, block_size, num_kv_heads, head_dim = key_cache.shape
    if block_size & (block_size - 1):
        raise ValueError(f"block_size {block_size} is not a power of two")
    if query.dim() != 3 or query.shape[2] != head_dim:
        raise ValueError(f"query must be [tokens, num_heads, {head_dim}], got {tuple(query.shape)}")
    if query.shape[1] % num_kv_heads:
        raise ValueError(f"num_heads {query.shape[1]} is not a multiple of num_kv_heads {num_kv_heads}")
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim, strides {t.stride()}")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.stride(1) != 1:
        raise ValueError(f"block_tables must be a row-contiguous int32 [num_seqs, max_blocks], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if seq_lens.dtype != torch.int32 or seq_lens.shape != (block_tables.shape[0],) or not seq_lens.is_contiguous():
        raise ValueError(f"seq_lens must be contiguous int32 [{block_tables.shape[0]}], got "
                         f"{seq_lens.dtype} {tuple(seq_lens.shape)}")
    devices = {t.device for t in (query, key_cache, value_cache, block_tables, seq_lens)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")
    return is_fp8
