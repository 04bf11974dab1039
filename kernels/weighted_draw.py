"""The draw at a uniform number from integer weights, one program per row: the row's total, then a scan of its
cumulative weight until it exceeds the uniform's share of the total. It finds the index that
worker_svc.sampling.ops.draw (the reference) finds from slices' sums and one slice, in one launch for twenty, and
stops reading a row at the drawn index. Integer sums are exact, so both find the same one."""
import torch
import triton
import triton.language as tl

_BLOCK = 2048  # weights summed at once


@triton.jit
def _weighted_draw_kernel(weights_ptr, uniform_ptr, out_ptr, n, row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    weights_ptr += row * row_stride
    offsets = tl.arange(0, BLOCK)
    total = tl.full([], 0, dtype=tl.int64)
    for start in range(0, n, BLOCK):
        total += tl.sum(tl.load(weights_ptr + start + offsets, mask=start + offsets < n, other=0), axis=0)
    target = tl.minimum((tl.load(uniform_ptr + row) * total.to(tl.float64)).to(tl.int64), total - 1)
    before = tl.full([], 0, dtype=tl.int64)
    drawn = tl.full([], -1, dtype=tl.int64)
    start = 0
    while (drawn < 0) & (start < n):
        weights = tl.load(weights_ptr + start + offsets, mask=start + offsets < n, other=0)
        crossing = tl.min(tl.where(before + tl.cumsum(weights, axis=0) > target, offsets, BLOCK), axis=0)
        drawn = tl.where(crossing < BLOCK, start + crossing, drawn).to(tl.int64)
        before += tl.sum(weights, axis=0)
        start += BLOCK
    tl.store(out_ptr + row, drawn)


def weighted_draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights: [batch, n] int64 >= 0, rows contiguous; uniform: [batch] float64 in [0, 1). -> [batch] int64: per row,
    the first index whose cumulative weight exceeds min(floor(uniform * total), total - 1)."""
    batch, n = weights.shape
    if weights.stride(1) != 1:
        raise ValueError("weights rows must be contiguous")
    out = torch.empty(batch, dtype=torch.int64, device=weights.device)
    if batch:
        _weighted_draw_kernel[(batch,)](weights, uniform, out, n, weights.stride(0), BLOCK=min(_BLOCK,
                                        triton.next_power_of_2(n)), num_warps=8)
    return out
