"""The rotary embedding's cos/sin table: plain torch, read by the Triton kernels and by the torch path alike."""
import math

import torch

Frequencies = tuple[torch.Tensor, float]  # fp32 inverse frequencies [rotary_dim / 2], and the factor on cos and sin


def _plain_inv_freq(rotary_dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype=torch.float) / rotary_dim))


def _default(rotary_dim: int, base: float, scaling: dict, max_position: int) -> Frequencies:
    return _plain_inv_freq(rotary_dim, base), 1.0


def _linear(rotary_dim: int, base: float, scaling: dict, max_position: int) -> Frequencies:
    """Positions divided by `factor`."""
    return _plain_inv_freq(rotary_dim, base) / scaling["factor"], 1.0


def _llama3(rotary_dim: int, base: float, scaling: dict, max_position: int) -> Frequencies:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between."""
    inv_freq = _plain_inv_freq(rotary_dim, base)
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


def _yarn(rotary_dim: int, base: float, scaling: dict, max_position: int) -> Frequencies:
    """YaRN: the frequencies that turn fewer than beta_slow times over the original context divided by `factor`,
    those turning more than beta_fast times kept, a linear ramp over the dimensions in between; cos and sin scaled by
    the attention factor (given, or from the mscale of its factor)."""
    factor, original_context = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dimension_of(rotations: float) -> float:
        return rotary_dim * math.log(original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension_of(beta_fast), dimension_of(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2).to(dtype=torch.float) / rotary_dim)
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # the share of each frequency kept as it is (extrapolated)
    return 1.0 / (factor * pos_freqs) * (1 - kept) + 1.0 / pos_freqs * kept, _yarn_attention_factor(scaling)


def _yarn_attention_factor(scaling: dict) -> float:
    if scaling.get("attention_factor") is not None:
        return scaling["attention_factor"]
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim))
    return _yarn_mscale(factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _longrope(rotary_dim: int, base: float, scaling: dict, max_position: int) -> Frequencies:
    """Phi-3's LongRoPE: each frequency divided by its own factor, the long ones for a table longer than
    original_max_position_embeddings (every position then takes them, as vLLM does; transformers takes the short
    ones until a sequence outgrows that length, then recomputes it with the long ones); cos and sin scaled by the
    attention factor, sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) unless the config gives it."""
    original = scaling["original_max_position_embeddings"]
    factors = scaling["long_factor"] if max_position > original else scaling["short_factor"]
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        factor = scaling["factor"]
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return inv_freq, attention_factor


_ROPE_TYPES = {"default": _default, "linear": _linear, "llama3": _llama3, "yarn": _yarn,
               "longrope": _longrope}  # as transformers'


def rope_frequencies(rotary_dim: int, base: float, rope_scaling: dict | None, max_position: int) -> Frequencies:
    """(fp32 inverse frequencies [rotary_dim / 2], the factor on cos and sin) as transformers' rope init functions
    compute them, for a table of max_position rows; rope_scaling None: plain rope."""
    scaling = rope_scaling or {}
    rope_type = scaling.get("rope_type", "default")
    if rope_type not in _ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported ({', '.join(_ROPE_TYPES)})")
    return _ROPE_TYPES[rope_type](rotary_dim, base, scaling, max_position)


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


def sectioned_cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor, sections: torch.Tensor,
                      frequencies: torch.Tensor) -> torch.Tensor:
    """Cos/sin rows [num_tokens, 2 * len(sections)] of tokens with several positions each (positions: [num_rows,
    num_tokens]), as the operators take a table's rows: column c holds frequency frequencies[c] of cos_sin_cache at
    the token's position positions[sections[c]]. Multimodal rope (temporal, height and width sections of the
    frequencies) and a vision tower's 2-D rope (height and width) are such rows."""
    half = cos_sin_cache.shape[1] // 2
    at = positions[sections].T  # [num_tokens, columns]: the position each column reads
    return torch.cat([cos_sin_cache[at, frequencies], cos_sin_cache[at, frequencies + half]], dim=-1)
