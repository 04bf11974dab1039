"""sluice.worker.sampling.threshold.threshold_key (the reference) on a GPU, one program per row and no atomics: the
smallest key t whose larger keys weigh less than the limit, found four bits at a time. Each of eight passes over
the row weighs the keys above 15 evenly spaced pivots of the range left and keeps the sixteenth of it where the
weight above falls under the limit; a ninth pass weighs the keys above t and those equal to it. Weights are integers,
so every sum is exact and the key is the reference's. The last pass also counts the keys equal to t, which top-p's
tie rule needs."""
import torch
import triton
import triton.language as tl

_BLOCK = 512  # keys compared with the 16 pivots at once
_HALF_RANGE = tl.constexpr(2**31)  # keys are int32: t + 2**31 runs over 32 bits


@triton.jit
def _block(keys_ptr, weights_ptr, start, offsets, n, HAS_WEIGHTS: tl.constexpr):
    """A block of the row: its keys, their weights (1 each without weights, 0 past the row) and which are in it."""
    inside = start + offsets < n
    keys = tl.load(keys_ptr + start + offsets, mask=inside, other=0).to(tl.int64)
    if HAS_WEIGHTS:
        weights = tl.load(weights_ptr + start + offsets, mask=inside, other=0)
    else:
        weights = inside.to(tl.int64)
    return keys, weights, inside


@triton.jit
def _threshold_search_kernel(keys_ptr, weights_ptr, limit_ptr, key_out_ptr, above_out_ptr, tied_out_ptr,
                             count_out_ptr, n, keys_row_stride, weights_row_stride, HAS_WEIGHTS: tl.constexpr,
                             BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    keys_ptr += row * keys_row_stride
    weights_ptr += row * weights_row_stride
    limit = tl.load(limit_ptr + row)
    offsets = tl.arange(0, BLOCK)
    digits = tl.arange(0, 16).to(tl.int64)
    found = tl.full([], 0, dtype=tl.int64)  # the bits of t + 2**31 found so far
    for round in tl.static_range(8):
        shift = 28 - 4 * round
        pivots = found + ((digits + 1) << shift) - 1 - _HALF_RANGE  # the top of each sixteenth of the range left
        weight_above = tl.zeros([16], dtype=tl.int64)
        for start in range(0, n, BLOCK):
            keys, weights, _ = _block(keys_ptr, weights_ptr, start, offsets, n, HAS_WEIGHTS)
            weight_above += tl.sum(tl.where(keys[:, None] > pivots[None, :], weights[:, None], 0), axis=0)
        found += tl.sum((weight_above >= limit).to(tl.int64), axis=0) << shift  # the sixteenths passed over
    key = found - _HALF_RANGE
    above = tl.full([], 0, dtype=tl.int64)
    tied = tl.full([], 0, dtype=tl.int64)
    count = tl.full([], 0, dtype=tl.int64)
    for start in range(0, n, BLOCK):
        keys, weights, inside = _block(keys_ptr, weights_ptr, start, offsets, n, HAS_WEIGHTS)
        above += tl.sum(tl.where(keys > key, weights, 0), axis=0)
        tied += tl.sum(tl.where(keys == key, weights, 0), axis=0)
        count += tl.sum(((keys == key) & inside).to(tl.int64), axis=0)
    tl.store(key_out_ptr + row, key)
    tl.store(above_out_ptr + row, above)
    tl.store(tied_out_ptr + row, tied)
    tl.store(count_out_ptr + row, count)


def threshold_search(keys: torch.Tensor, weights: torch.Tensor | None,
                     limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """keys: [batch, n] int32 (ordered float bits), rows contiguous; weights: [batch, n] int64 >= 0, rows contiguous,
    or None where every key weighs 1; limit: [batch] int64, positive and at most the row's total. -> per row, the
    smallest key among those of positive weight whose larger keys weigh less than the limit, the weight of those
    larger keys, the weight of the keys equal to it and how many keys equal it, each [batch] int64."""
    batch, n = keys.shape
    if keys.stride(1) != 1 or (weights is not None and weights.stride(1) != 1):
        raise ValueError("keys and weights rows must be contiguous")
    key, above, tied, count = (torch.empty(batch, dtype=torch.int64, device=keys.device) for _ in range(4))
    if batch:
        _threshold_search_kernel[(batch,)](
            keys, keys if weights is None else weights, limit, key, above, tied, count, n, keys.stride(0),
            0 if weights is None else weights.stride(0), HAS_WEIGHTS=weights is not None, BLOCK=_BLOCK, num_warps=8)
    return key, above, tied, count
