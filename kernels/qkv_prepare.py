"""Attention inputs from the fused qkv projection in one launch: optional q/k RMSNorm (Llama's or Gemma's), rotary
(of each head's first rotary_dim dims: all, or a partial rotary's share), KV-cache write."""
import torch
import triton
import triton.language as tl

from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs
from sluice.kernels.kv_quant import check_cache_writable, check_kv_scales, to_cache_element
from sluice.kernels.reshape_and_cache import reshape_and_cache_ref
from sluice.kernels.rms_norm import NORM_DTYPES, apply_norm_weight, rms_norm_ref
from sluice.kernels.rotary_embedding import check_cos_sin_cache, rotary_embedding_ref


@triton.jit
def _normed_rotated_heads(
    first_head_ptr, stride_h, weight_ptr, eps, cos, sin,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr, HAS_NORM: tl.constexpr, GEMMA_NORM: tl.constexpr,
):
    """One token's [NUM_HEADS, HEAD_DIM] rows, RMS-normalised over head_dim if HAS_NORM (Gemma's norm with
    GEMMA_NORM), then rotated in their first ROTARY_DIM dims.

    Every element is loaded together with its rotate-half partner (dim d < ROTARY_DIM pairs with d +- ROTARY_DIM / 2,
    a dim past them with itself), so rows stay whole and the sum of squares reduces in the same shape as
    kernels.rms_norm.
    """
    half = ROTARY_DIM // 2
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    partner = tl.where(d < half, d + half, tl.where(d < ROTARY_DIM, d - half, d))
    mask = (h < NUM_HEADS) & (d < HEAD_DIM)
    x = tl.load(first_head_ptr + h * stride_h + d, mask=mask, other=0.0)
    dtype = x.dtype
    x = x.to(tl.float32)
    x_partner = tl.load(first_head_ptr + h * stride_h + partner, mask=mask, other=0.0).to(tl.float32)

    # -- RMSNorm in fp32, its weight applied as kernels.rms_norm applies it, rounded to the input dtype
    if HAS_NORM:
        inv_rms = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        w = tl.load(weight_ptr + d, mask=d < HEAD_DIM, other=0.0).to(tl.float32)
        w_partner = tl.load(weight_ptr + partner, mask=d < HEAD_DIM, other=0.0).to(tl.float32)
        x = apply_norm_weight(x * inv_rms, w, dtype, GEMMA_NORM).to(tl.float32)
        x_partner = apply_norm_weight(x_partner * inv_rms, w_partner, dtype, GEMMA_NORM).to(tl.float32)

    # -- rotate: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) in fp32, rounded once; the dims past them pass
    rotated_half = tl.where(d < half, -x_partner, x_partner)
    return tl.where(d < ROTARY_DIM, x * cos + rotated_half * sin, x).to(dtype)


@triton.jit
def _prepare_qkv_kernel(
    qkv_ptr, positions_ptr, cos_sin_ptr, q_norm_weight_ptr, k_norm_weight_ptr, slot_mapping_ptr,
    q_out_ptr, key_cache_ptr, value_cache_ptr, k_scale_ptr, v_scale_ptr,
    stride_t, stride_h, stride_cs,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    eps,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV_H: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_NORM: tl.constexpr, GEMMA_NORM: tl.constexpr, KV_FP8: tl.constexpr, PDL: tl.constexpr,
):
    """Program `token` turns its row of the fused qkv projection (q heads, k heads, v heads) into attention inputs.

    q and k heads get the optional RMSNorm (as kernels.rms_norm: fp32 statistics, rounded to the input dtype before
    and after the weight multiply, or with GEMMA_NORM times 1 + weight in fp32, rounded once) and then NeoX rotary of
    their first ROTARY_DIM dims by the angles of positions[token] (as kernels.rotary_embedding: cos_sin_cache row p
    holds cos then sin, fp32 math, one rounding).
    q goes to the contiguous q_out; k and the untouched v go to slot slot_mapping[token] of the paged caches (as
    kernels.reshape_and_cache, quantized with their scales into FP8 caches), skipped for a negative (padding) slot.
    """
    wait_for_inputs(PDL)
    token = tl.program_id(0).to(tl.int64)
    row_ptr = qkv_ptr + token * stride_t
    d = tl.arange(0, BLOCK_D)[None, :]

    # -- cos/sin per rotated dim: d and d + ROTARY_DIM / 2 share one angle
    half = ROTARY_DIM // 2
    angle = tl.where(d < half, d, d - half)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + angle, mask=d < ROTARY_DIM, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + half + angle, mask=d < ROTARY_DIM, other=0.0).to(tl.float32)

    # -- q
    h = tl.arange(0, BLOCK_H)[:, None]
    q = _normed_rotated_heads(row_ptr, stride_h, q_norm_weight_ptr, eps, cos, sin,
                              NUM_HEADS, HEAD_DIM, ROTARY_DIM, BLOCK_H, BLOCK_D, HAS_NORM, GEMMA_NORM)
    tl.store(q_out_ptr + (token * NUM_HEADS + h) * HEAD_DIM + d, q, mask=(h < NUM_HEADS) & (d < HEAD_DIM))

    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    kv_h = tl.arange(0, BLOCK_KV_H)[:, None]
    kv_mask = (kv_h < NUM_KV_HEADS) & (d < HEAD_DIM)
    # -- k
    k = _normed_rotated_heads(row_ptr + NUM_HEADS * stride_h, stride_h, k_norm_weight_ptr, eps, cos, sin,
                              NUM_KV_HEADS, HEAD_DIM, ROTARY_DIM, BLOCK_KV_H, BLOCK_D, HAS_NORM, GEMMA_NORM)
    k = to_cache_element(k, k_scale_ptr, key_cache_ptr, KV_FP8)
    tl.store(key_cache_ptr + block * stride_kcb + offset * stride_kcs + kv_h * stride_kch + d, k, mask=kv_mask)
    # -- v
    v = to_cache_element(tl.load(row_ptr + (NUM_HEADS + NUM_KV_HEADS + kv_h) * stride_h + d, mask=kv_mask),
                         v_scale_ptr, value_cache_ptr, KV_FP8)
    tl.store(value_cache_ptr + block * stride_vcb + offset * stride_vcs + kv_h * stride_vch + d, v, mask=kv_mask)


def prepare_qkv(
    qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None, eps: float,
    key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, gemma_norm: bool = False,
    pdl: bool = True,
) -> torch.Tensor:
    """Returns a new contiguous q [num_tokens, num_heads, head_dim]; writes k and v into the caches in place.

    qkv: [num_tokens, num_heads + 2 * num_kv_heads, head_dim], q heads then k heads then v heads (e.g. a view of the
    fused projection output; any token/head strides, head_dim contiguous); num_kv_heads is the caches' third dim.
    q_norm_weight, k_norm_weight: [head_dim] RMSNorm weights applied per head before rotary (Qwen3), both or None;
    gemma_norm: they are Gemma 3's, applied as rms_norm(..., gemma_norm=True) applies them.
    positions: int32/int64 [num_tokens]; cos_sin_cache: [max_position, rotary_dim] from build_cos_sin_cache, an even
    rotary_dim <= head_dim: the leading dims of each head that rotate (Phi-4-mini's partial rotary: 96 of 128);
    caches: [num_blocks, block_size, num_kv_heads, head_dim], in qkv's dtype, or FP8 (CUDA only) with the float32
    scales k_scale and v_scale; slot_mapping: int64 [num_tokens], negative = skip.
    """
    if qkv.dim() != 3 or key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(f"qkv {tuple(qkv.shape)} must be [num_tokens, heads, head_dim] and caches "
                         f"{tuple(key_cache.shape)}/{tuple(value_cache.shape)} [num_blocks, block_size, num_kv_heads, "
                         f"head_dim]")
    num_tokens, total_heads, head_dim = qkv.shape
    num_kv_heads = key_cache.shape[2]
    num_heads = total_heads - 2 * num_kv_heads
    if num_heads < 1 or key_cache.shape[3] != head_dim:
        raise ValueError(f"qkv {tuple(qkv.shape)} does not hold q heads plus 2 x {num_kv_heads} kv heads of the "
                         f"caches' head_dim {key_cache.shape[3]}")
    if qkv.dtype not in NORM_DTYPES:
        raise TypeError(f"qkv dtype {qkv.dtype} not in {NORM_DTYPES}")
    kv_fp8 = check_kv_scales(qkv.dtype, key_cache, value_cache, k_scale, v_scale)
    check_cache_writable(key_cache)
    check_cos_sin_cache(cos_sin_cache, head_dim)
    if positions.dtype not in (torch.int32, torch.int64) or positions.shape != (num_tokens,):
        raise ValueError(f"positions must be int [{num_tokens}], got {positions.dtype} {tuple(positions.shape)}")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be int64 [{num_tokens}], got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")
    has_norm = q_norm_weight is not None
    if has_norm != (k_norm_weight is not None):
        raise ValueError("q_norm_weight and k_norm_weight must be given together")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None and (w.shape != (head_dim,) or not w.is_contiguous()):
            raise ValueError(f"{name} must be contiguous [{head_dim}], got {tuple(w.shape)}")
    for name, t in (("qkv", qkv), ("cos_sin_cache", cos_sin_cache), ("key_cache", key_cache),
                    ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, strides {t.stride()}")

    q = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q
    block_h, block_d = triton.next_power_of_2(num_heads), triton.next_power_of_2(head_dim)
    # NOTE: not measured yet (benchmarks/kernel_timings.py times it): warps grow with the q tile as in kernels.rms_norm, so each
    # thread keeps <= 16 elements of it in registers.
    num_warps = min(max(block_h * block_d // 512, 1), 16)
    _prepare_qkv_kernel[(num_tokens,)](
        qkv, positions, cos_sin_cache, q_norm_weight if has_norm else qkv, k_norm_weight if has_norm else qkv,
        slot_mapping, q, key_cache, value_cache, qkv if k_scale is None else k_scale,
        qkv if v_scale is None else v_scale,
        qkv.stride(0), qkv.stride(1), cos_sin_cache.stride(0),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        eps,
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, ROTARY_DIM=cos_sin_cache.shape[1],
        BLOCK_SIZE=key_cache.shape[1],
        BLOCK_H=block_h, BLOCK_KV_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=block_d, HAS_NORM=has_norm,
        GEMMA_NORM=gemma_norm, KV_FP8=kv_fp8, num_warps=num_warps, **dependent_launch(qkv.device, pdl),
    )
    return q


def prepare_qkv_ref(
    qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None, eps: float,
    key_cache: torch.Tensor, value_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, gemma_norm: bool = False,
) -> torch.Tensor:
    """The unfused sequence in plain torch: split, rms_norm_ref, rotary_embedding_ref, reshape_and_cache_ref."""
    num_kv_heads = key_cache.shape[2]
    q, k, v = qkv.split([qkv.shape[1] - 2 * num_kv_heads, num_kv_heads, num_kv_heads], dim=1)
    if q_norm_weight is not None:
        q, k = rms_norm_ref(q, q_norm_weight, eps, gemma_norm), rms_norm_ref(k, k_norm_weight, eps, gemma_norm)
    q, k = q.clone(memory_format=torch.contiguous_format), k.clone()  # rotated in place below; qkv stays untouched
    rotary_embedding_ref(positions, q, k, cos_sin_cache)
    reshape_and_cache_ref(k, v, key_cache, value_cache, slot_mapping, k_scale, v_scale)
    return q
