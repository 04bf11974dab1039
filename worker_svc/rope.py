import math

import torch


def build_cos_sin_cache(head_dim: int, max_position: int, base: float, rope_scaling: dict | None,
                        dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[max_position, head_dim]: cos of every position's angles in the first half, sin in the second."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope_scaling is not None:
        inv_freq = _SCALINGS[rope_scaling["rope_type"]](inv_freq, rope_scaling)
    angles = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype)


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(is_medium, smoothed, scaled)


_SCALINGS = {"llama3": _llama3}
