"""The FP8 KV cache's arithmetic, shared by the kernels that write the cache and the ones that read it.

An FP8 cache holds float8 e4m3 elements with one float32 scale per cache tensor (a layer's keys, or its values):
stored = clamp(x / scale) to e4m3's range, and x is read back as stored * scale in float32. A cache in the model's
dtype takes no scales and holds x as it is. Writing an FP8 cache needs a GPU: Triton's interpreter (the CPU) rounds
FP8 stores wrongly.
"""
import torch
import triton
import triton.language as tl

KV_FP8 = torch.float8_e4m3fn
KV_FP8_MAX = torch.finfo(KV_FP8).max
_KV_FP8_MAX = tl.constexpr(KV_FP8_MAX)


@triton.jit
def to_cache_element(x, scale_ptr, cache_ptr, IS_FP8: tl.constexpr):
    """x in the element type of the cache at cache_ptr: divided by the scale and clamped to e4m3's range first for an
    FP8 cache."""
    if IS_FP8:
        x = tl.clamp(x.to(tl.float32) / tl.load(scale_ptr), -_KV_FP8_MAX, _KV_FP8_MAX)
    return x.to(cache_ptr.dtype.element_ty)


@triton.jit
def load_scale(scale_ptr, IS_FP8: tl.constexpr):
    """An FP8 cache's scale (a cache in the model's dtype has none: 1.0, never applied)."""
    if IS_FP8:
        return tl.load(scale_ptr)
    return 1.0


def check_kv_scales(dtype: torch.dtype, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> bool:
    """Whether the caches are FP8; they must be FP8 with both scales (float32 scalars on their device) or in `dtype`
    without scales."""
    if key_cache.dtype != value_cache.dtype or key_cache.dtype not in (dtype, KV_FP8):
        raise TypeError(f"cache dtypes {key_cache.dtype}/{value_cache.dtype} must both be {dtype} or {KV_FP8}")
    is_fp8 = key_cache.dtype == KV_FP8
    if is_fp8 != (k_scale is not None) or is_fp8 != (v_scale is not None):
        raise ValueError(f"k_scale and v_scale go with {KV_FP8} caches, and only with them; the caches are "
                         f"{key_cache.dtype}")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None and (scale.dtype != torch.float32 or scale.numel() != 1
                                  or scale.device != key_cache.device):
            raise ValueError(f"{name} must be one float32 on {key_cache.device}, got {scale.dtype} "
                             f"{tuple(scale.shape)} on {scale.device}")
    return is_fp8


def check_cache_writable(key_cache: torch.Tensor) -> None:
    """FP8 stores need a GPU: Triton's interpreter rounds float32 to e4m3 without carrying into the exponent (127.5
    becomes 64 instead of 128), so its FP8 caches would be wrong."""
    if key_cache.dtype == KV_FP8 and key_cache.device.type != "cuda":
        raise ValueError(f"writing {KV_FP8} caches needs CUDA; Triton's interpreter rounds FP8 stores wrongly")


def to_cache_element_ref(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None:
        return x.to(cache_dtype)
    return (x.float() / scale).clamp(-KV_FP8_MAX, KV_FP8_MAX).to(cache_dtype)


def from_cache_element_ref(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Float32 values of cache elements."""
    return x.float() if scale is None else x.float() * scale
