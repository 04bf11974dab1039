"""Counter-based uniform numbers for seeded sampling, one program per block of rows: the "lowbias32" integer hash of
(seed, output position), as sluice.worker.sampling.seeded_random computes it in some eighty tensor operations, here in one
launch. Every operation is exact unsigned integer arithmetic, so the numbers are bit-identical to the torch path's."""
import torch
import triton
import triton.language as tl

_MASK32 = 0xFFFFFFFF
_ULP = tl.constexpr(2.0**-52)  # the uniforms are 52 bits of hash, each half a step above its multiple of this


@triton.jit
def _hash32(x):
    """x: uint64 below 2**32."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["num_rows"])  # one compiled variant for every batch size
def _seeded_uniform_kernel(seeds_ptr, positions_ptr, out_ptr, num_rows, seed_stride, seed_word_stride,
                           position_stride, stream, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rows < num_rows
    seed_low = tl.load(seeds_ptr + rows * seed_stride, mask=mask, other=0).to(tl.uint64)
    seed_high = tl.load(seeds_ptr + rows * seed_stride + seed_word_stride, mask=mask, other=0).to(tl.uint64)
    position = tl.load(positions_ptr + rows * position_stride, mask=mask, other=0).to(tl.uint64) & 0xFFFFFFFF
    key = _hash32(_hash32(_hash32(seed_low) ^ (seed_high ^ stream)) ^ position)
    low = _hash32(key ^ 0x5BD1E995)
    mantissa = ((key << 20) + (low >> 12)).to(tl.int64).to(tl.float64)
    tl.store(out_ptr + rows, (mantissa + 0.5) * _ULP, mask=mask)


def seeded_uniform(seeds: torch.Tensor, positions: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """seeds: [batch, 2] int64 (the low and high 32 bits of each row's seed, any strides); positions: [batch] int64;
    stream: mixed into the seeds' high words, a second independent sequence per seed. -> [batch] float64 in (0, 1)."""
    batch = positions.shape[0]
    out = torch.empty(batch, dtype=torch.float64, device=positions.device)
    if batch:
        block = 128
        _seeded_uniform_kernel[(triton.cdiv(batch, block),)](
            seeds, positions, out, batch, seeds.stride(0), seeds.stride(1), positions.stride(0), stream, BLOCK=block,
            num_warps=4)
    return out


def _hash32_ref(x: int) -> int:
    x ^= x >> 16
    x = x * 0x7FEB352D & _MASK32
    x ^= x >> 15
    x = x * 0x846CA68B & _MASK32
    return x ^ (x >> 16)


def seeded_uniform_ref(seeds: torch.Tensor, positions: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """The same numbers from Python integers, row by row."""
    values = []
    for (seed_low, seed_high), position in zip(seeds.tolist(), positions.tolist()):
        key = _hash32_ref(_hash32_ref(_hash32_ref(seed_low) ^ seed_high ^ stream) ^ position & _MASK32)
        values.append(((key << 20) + (_hash32_ref(key ^ 0x5BD1E995) >> 12) + 0.5) * 2.0**-52)
    return torch.tensor(values, dtype=torch.float64, device=positions.device)
