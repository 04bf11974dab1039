"""Counter-based random numbers: a request's draw is a hash of (its seed, the output position), so it depends neither
on the rest of the batch nor on any generator's state, and costs one hash per row, not per token.

Integers stay below 2**32 in int64 tensors and every product below 2**63, so the arithmetic is exact on any device.
The mixing function is Chris Wellons' "lowbias32" integer hash (a bijection on 32-bit integers). On a GPU, one
Triton kernel (kernels.seeded_uniform) computes the same numbers that the eighty-odd tensor operations here do.
"""
import torch

from sluice.worker.sampling import kernel_path

_MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32, with x < 2**32, in two 16-bit halves of the constant."""
    low = x * (constant & 0xFFFF)
    high = ((x * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & _MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """seeds: [batch, 2] int64 (low, high 32 bits); positions: [batch] int64; stream: below 2**32, mixed into the
    seeds' high words (a second sequence per seed) -> [batch] float64, uniform in (0, 1)."""
    if kernel_path.runs_kernels(seeds):
        from sluice.kernels.seeded_uniform import seeded_uniform as kernel  # every CUDA build of torch brings Triton
        return kernel(seeds, positions, stream)
    return seeded_uniform_torch(seeds, positions, stream)


def seeded_uniform_torch(seeds: torch.Tensor, positions: torch.Tensor, stream: int = 0) -> torch.Tensor:
    key = hash32(hash32(hash32(seeds[:, 0]) ^ seeds[:, 1] ^ stream) ^ (positions & _MASK32))
    high, low = key, hash32(key ^ 0x5BD1E995)
    return ((high << 20) + (low >> 12)).double().add_(0.5).mul_(2.0**-52)
