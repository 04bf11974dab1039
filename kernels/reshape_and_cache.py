"""Write the new tokens' keys and values into the paged KV cache."""
import torch
import triton
import triton.language as tl

from sluice.kernels.kv_quant import check_cache_writable, check_kv_scales, to_cache_element, to_cache_element_ref


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, k_scale_ptr, v_scale_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, KV_FP8: tl.constexpr,
):
    """Program `token` copies its [num_kv_heads, head_dim] key and value rows to slot slot_mapping[token].

    A slot id is block_id * BLOCK_SIZE + offset in the [num_blocks, block_size, num_kv_heads, head_dim] caches; a
    negative slot marks a padding token and is skipped. Values are copied bit for bit (no arithmetic), or quantized
    with their scales into FP8 caches (kernels.kv_quant).
    """
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE

    # -- key
    k = tl.load(key_ptr + token.to(tl.int64) * stride_kt + h * stride_kh + d, mask=mask)
    k = to_cache_element(k, k_scale_ptr, key_cache_ptr, KV_FP8)
    tl.store(key_cache_ptr + block * stride_kcb + offset * stride_kcs + h * stride_kch + d, k, mask=mask)
    # -- value
    v = tl.load(value_ptr + token.to(tl.int64) * stride_vt + h * stride_vh + d, mask=mask)
    v = to_cache_element(v, v_scale_ptr, value_cache_ptr, KV_FP8)
    tl.store(value_cache_ptr + block * stride_vcb + offset * stride_vcs + h * stride_vch + d, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """In place: key_cache/value_cache[slot // block_size, slot % block_size] = key/value[token] for slot >= 0.

    key, value: [num_tokens, num_kv_heads, head_dim] (any token/head strides, e.g. views of a fused qkv output);
    caches: [num_blocks, block_size, num_kv_heads, head_dim], in key's dtype, or FP8 (CUDA only) with the float32
    scales k_scale and v_scale; slot_mapping: int64 [num_tokens].
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} differ")
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape or key_cache.shape[2:] != key.shape[1:]:
        raise ValueError(f"caches {tuple(key_cache.shape)}/{tuple(value_cache.shape)} do not hold "
                         f"[num_blocks, block_size, {num_kv_heads}, {head_dim}]")
    if value.dtype != key.dtype:
        raise TypeError(f"key {key.dtype} and value {value.dtype} differ")
    kv_fp8 = check_kv_scales(key.dtype, key_cache, value_cache, k_scale, v_scale)
    check_cache_writable(key_cache)
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping must be int64 [{num_tokens}], got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim, strides {t.stride()}")
    if num_tokens == 0:
        return
    block_size = key_cache.shape[1]
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, key if k_scale is None else k_scale, key if v_scale is None else v_scale,
        slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim), KV_FP8=kv_fp8,
    )


def reshape_and_cache_ref(
    key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
) -> None:
    """Plain torch, in place: scatter the valid tokens into their caches' (block, offset) slots."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks, offsets = slots // key_cache.shape[1], slots % key_cache.shape[1]
    key_cache[blocks, offsets] = to_cache_element_ref(key[keep], key_cache.dtype, k_scale)
    value_cache[blocks, offsets] = to_cache_element_ref(value[keep], value_cache.dtype, v_scale)
