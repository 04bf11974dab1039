"""The rotary embedding's cos/sin table: plain torch, read by the Triton kernels and by the torch path alike."""
import math

import torch


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict | None = None) -> torch.Tensor:
    """fp32 [head_dim / 2] inverse frequencies, as transformers' "default", "linear" and "llama3" rope init functions
    do."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    scaling = rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":  # positions divided by `factor`
        return inv_freq / scaling["factor"]
    if rope_type != "llama3":
        raise ValueError(f"rope_type {rope_type!r} is not supported (default, linear, llama3)")
    # -- Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def build_cos_sin_cache(
    head_dim: int, max_position: int, base: float, rope_scaling: dict | None, dtype: torch.dtype,
) -> torch.Tensor:
    """[max_position, head_dim] table: cos(p * inv_freq) then sin(p * inv_freq), computed in fp32, cast to dtype.

    rope_scaling is the model config's `rope_scaling` (or `rope_parameters`) dict, or None for plain rope.
    """
    freqs = torch.arange(max_position, dtype=torch.float)[:, None] * rope_inv_freq(head_dim, base, rope_scaling)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
