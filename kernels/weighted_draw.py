"""The draw at a uniform number from integer weights, one program per row: the row's total, then a scan of its
cumulative weight until it exceeds the uniform's share of the total. It finds the index that
worker_svc.sampling.ops.draw (the reference) finds from slices' sums and one slice, in one launch for twenty, and
stops reading a row at the drawn index. Integer sums are exact, so both find the same one. Given float32
probabilities, it converts them to fixed-point weights as it reads them, as worker_svc.sampling.ops.fixed_point
does, rather than the caller writing and the kernel reading an int64 copy of the row."""
import torch
import triton
import triton.language as tl

_BLOCK = 2048  # weights summed at once
_FIXED_POINT_ONE = tl.constexpr(2.0**40)  # worker_svc.sampling.ops.FIXED_POINT_BITS


@triton.jit
def _load_weights(weights_ptr, start, offsets, n, FROM_PROBS: tl.constexpr):
    weights = tl.load(weights_ptr + start + offsets, mask=start + offsets < n, other=0)
    if FROM_PROBS:
        weights = (weights * _FIXED_POINT_ONE).to(tl.int64)
    return weights


@triton.jit
def _weighted_draw_kernel(weights_ptr, uniform_ptr, out_ptr, n, row_stride, FROM_PROBS: tl.constexpr,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    weights_ptr += row * row_stride
    offsets = tl.arange(0, BLOCK)
    total = tl.full([], 0, dtype=tl.int64)
    for start in range(0, n, BLOCK):
        total += tl.sum(_load_weights(weights_ptr, start, offsets, n, FROM_PROBS), axis=0)
    target = tl.minimum((tl.load(uniform_ptr + row) * total.to(tl.float64)).to(tl.int64), total - 1)
    before = tl.full([], 0, dtype=tl.int64)
    drawn = tl.full([], -1, dtype=tl.int64)
    start = 0
    while (drawn < 0) & (start < n):
        weights = _load_weights(weights_ptr, start, offsets, n, FROM_PROBS)
        crossing = tl.min(tl.where(before + tl.cumsum(weights, axis=0) > target, offsets, BLOCK), axis=0)
        drawn = tl.where(crossing < BLOCK, start + crossing, drawn).to(tl.int64)
        before += tl.sum(weights, axis=0)
        start += BLOCK
    tl.store(out_ptr + row, drawn)


def weighted_draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights: [batch, n] int64 >= 0, or float32 probabilities in [0, 1] (unnormalised: weights of
    2**FIXED_POINT_BITS times them, rounded down), rows contiguous; uniform: [batch] float64 in [0, 1). -> [batch]
    int64: per row, the first index whose cumulative weight exceeds min(floor(uniform * total), total - 1)."""
    batch, n = weights.shape
    if weights.stride(1) != 1:
        raise ValueError("weights rows must be contiguous")
    if weights.dtype not in (torch.int64, torch.float32):
        raise TypeError(f"weights must be int64 or float32 probabilities, got {weights.dtype}")
    out = torch.empty(batch, dtype=torch.int64, device=weights.device)
    if batch:
        _weighted_draw_kernel[(batch,)](weights, uniform, out, n, weights.stride(0),
                                        FROM_PROBS=weights.dtype == torch.float32,
                                        BLOCK=min(_BLOCK, triton.next_power_of_2(n)), num_warps=8)
    return out
