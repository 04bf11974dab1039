"""The rotary embedding's cos/sin table: plain torch, read by the Triton kernels and by the torch path alike."""
import math

import torch


def rope_inv_freq(head_dim: int, base: float, rope_scaling: dict | None = None) -> torch.Tensor:
    """fp32 [head_dim / 2] inverse frequencies, as transformers' "default", "llama3" and "yarn" rope init functions
    do."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    scaling = rope_scaling or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, base, scaling)
    if rope_type != "llama3":
        raise ValueError(f"rope_type {rope_type!r} is not supported (default, llama3, yarn)")
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
    scale = rope_attention_factor(rope_scaling)
    return torch.cat((freqs.cos() * scale, freqs.sin() * scale), dim=-1).to(dtype)


def rope_attention_factor(rope_scaling: dict | None) -> float:
    """What cos and sin are multiplied by: YaRN's attention factor (given, or from the mscale of its factor), else 1."""
    scaling = rope_scaling or {}
    if scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    return _yarn_mscale(factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(head_dim: int, base: float, scaling: dict) -> torch.Tensor:
    """YaRN: the frequencies that turn fewer than beta_slow times over the original context divided by `factor`,
    those turning more than beta_fast times kept, a linear ramp over the dimensions in between."""
    factor, original_context = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dimension_of(rotations: float) -> float:
        return head_dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension_of(beta_fast), dimension_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, head_dim, 2).to(dtype=torch.float) / head_dim)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # the share of each frequency kept as it is (extrapolated)
    return 1.0 / (factor * pos_freqs) * (1 - kept) + 1.0 / pos_freqs * kept
