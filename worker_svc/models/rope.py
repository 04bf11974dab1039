"""The rotary embedding's cos/sin table: plain torch, read by the Triton kernels and by the torch path alike."""
import math

import torch

Frequencies = tuple[torch.Tensor, float]  # fp32 inverse frequencies [rotary_dim / 2], and the factor on cos and sin


def _default(exponents: torch.Tensor, base: float, scaling: dict, max_position: int) -> Frequencies:
    return 1.0 / (base**exponents), 1.0


def _llama3(exponents: torch.Tensor, base: float, scaling: dict, max_position: int) -> Frequencies:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between."""
    inv_freq = 1.0 / (base**exponents)
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
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama), 1.0


def _longrope(exponents: torch.Tensor, base: float, scaling: dict, max_position: int) -> Frequencies:
    """Phi-3's LongRoPE: each frequency divided by its own factor, the long ones for a table longer than
    original_max_position_embeddings (every position then takes them, as vLLM does; transformers takes the short
    ones until a sequence outgrows that length, then recomputes it with the long ones); cos and sin scaled by the
    attention factor, sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) unless the config gives it."""
    original = scaling["original_max_position_embeddings"]
    factors = scaling["long_factor"] if max_position > original else scaling["short_factor"]
    inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        factor = scaling["factor"]
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv_freq, attention_factor


ROPE_TYPES = {"default": _default, "llama3": _llama3, "longrope": _longrope}  # as transformers' rope init functions


def rope_frequencies(rotary_dim: int, base: float, rope_scaling: dict | None, max_position: int) -> Frequencies:
    """(fp32 inverse frequencies [rotary_dim / 2], the factor on cos and sin) as transformers' rope init functions
    compute them, for a table of max_position rows; rope_scaling None: plain rope."""
    scaling = rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported ({', '.join(ROPE_TYPES)})")
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype=torch.float) / rotary_dim
    return ROPE_TYPES[rope_type](exponents, base, scaling, max_position)


def build_cos_sin_cache(
    rotary_dim: int, max_position: int, base: float, rope_scaling: dict | None, dtype: torch.dtype,
) -> torch.Tensor:
    """[max_position, rotary_dim] table: cos(p * inv_freq) then sin(p * inv_freq), times the rope type's attention
    factor, computed in fp32, cast to dtype. The operators rotate the first rotary_dim dims of each head: all of them
    (head_dim), or a partial_rotary_factor of them (Phi-4-mini).

    rope_scaling is the model config's `rope_scaling` (or `rope_parameters`) dict, or None for plain rope.
    """
    inv_freq, attention_factor = rope_frequencies(rotary_dim, base, rope_scaling, max_position)
    freqs = torch.arange(max_position, dtype=torch.float)[:, None] * inv_freq
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return (table if attention_factor == 1.0 else table * attention_factor).to(dtype)
