"""The draw at a uniform number from integer weights, one program per row: the row's total, then a scan of its
cumulative weight until it exceeds the uniform's share of the total. It finds the index that
worker_svc.sampling.ops.draw (the reference) finds from slices' sums and one slice, in one launch for twenty, and
stops reading a row at the drawn index. Integer sums are exact, so both find the same one.

Given float32 probabilities, it converts them to fixed-point weights as it reads them, as
worker_svc.sampling.ops.fixed_point does, rather than the caller writing and the kernel reading an int64 copy of the
row. nucleus_draw also keeps, as it reads, what the filters over the whole vocabulary keep once the threshold
searches are done (worker_svc.sampling.ops._kept_in_token_order, in about a dozen full-vocabulary operations): top-p
the keys above its threshold key and, of those equal to it, the first ones in token order that still fit under its
mass limit; min-p the tokens at least min_p times as likely as the likeliest."""
import torch
import triton
import triton.language as tl

_BLOCK = 2048  # weights summed at once
_FIXED_POINT_ONE = tl.constexpr(2.0**40)  # worker_svc.sampling.ops.FIXED_POINT_BITS


@triton.jit
def _kept_weights(weights_ptr, keys_ptr, probs_ptr, start, offsets, n, last, ties_kept, ties_before, min_p,
                  FROM_PROBS: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr):
    """The block's kept weights, and how many of its keys equal top-p's threshold key."""
    inside = start + offsets < n
    weights = tl.load(weights_ptr + start + offsets, mask=inside, other=0)
    if FROM_PROBS:
        weights = (weights * _FIXED_POINT_ONE).to(tl.int64)
    num_ties = tl.full([], 0, dtype=tl.int64)
    if HAS_TOP_P:
        keys = tl.load(keys_ptr + start + offsets, mask=inside, other=0)
        ties = (keys == last) & inside
        tie_rank = ties_before + tl.cumsum(ties.to(tl.int64), axis=0)
        weights = tl.where((keys > last) | (ties & (tie_rank <= ties_kept)), weights, 0)
        num_ties = tl.sum(ties.to(tl.int64), axis=0)
    if HAS_MIN_P:
        probs = tl.load(probs_ptr + start + offsets, mask=inside, other=0.0)
        weights = tl.where(probs < min_p, 0, weights)
    return weights, num_ties


@triton.jit
def _draw_kernel(weights_ptr, keys_ptr, probs_ptr, last_ptr, ties_kept_ptr, min_p_ptr, uniform_ptr, out_ptr, n,
                 weights_row_stride, keys_row_stride, probs_row_stride, min_p_stride, FROM_PROBS: tl.constexpr,
                 HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    weights_ptr += row * weights_row_stride
    keys_ptr += row * keys_row_stride
    probs_ptr += row * probs_row_stride
    last = tl.full([], 0, dtype=tl.int64)
    ties_kept = tl.full([], 0, dtype=tl.int64)
    min_p = 0.0
    if HAS_TOP_P:
        last = tl.load(last_ptr + row)
        ties_kept = tl.load(ties_kept_ptr + row)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row * min_p_stride)
    offsets = tl.arange(0, BLOCK)
    total = tl.full([], 0, dtype=tl.int64)
    ties_before = tl.full([], 0, dtype=tl.int64)
    for start in range(0, n, BLOCK):
        weights, num_ties = _kept_weights(weights_ptr, keys_ptr, probs_ptr, start, offsets, n, last, ties_kept,
                                          ties_before, min_p, FROM_PROBS, HAS_TOP_P, HAS_MIN_P)
        total += tl.sum(weights, axis=0)
        ties_before += num_ties
    target = tl.minimum((tl.load(uniform_ptr + row) * total.to(tl.float64)).to(tl.int64), total - 1)
    before = tl.full([], 0, dtype=tl.int64)
    ties_before = tl.full([], 0, dtype=tl.int64)
    drawn = tl.full([], -1, dtype=tl.int64)
    start = 0
    while (drawn < 0) & (start < n):
        weights, num_ties = _kept_weights(weights_ptr, keys_ptr, probs_ptr, start, offsets, n, last, ties_kept,
                                          ties_before, min_p, FROM_PROBS, HAS_TOP_P, HAS_MIN_P)
        crossing = tl.min(tl.where(before + tl.cumsum(weights, axis=0) > target, offsets, BLOCK), axis=0)
        drawn = tl.where(crossing < BLOCK, start + crossing, drawn).to(tl.int64)
        before += tl.sum(weights, axis=0)
        ties_before += num_ties
        start += BLOCK
    tl.store(out_ptr + row, drawn)


def weighted_draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights: [batch, n] int64 >= 0, or float32 probabilities in [0, 1] (unnormalised: weights of
    2**FIXED_POINT_BITS times them, rounded down), rows contiguous; uniform: [batch] float64 in [0, 1). -> [batch]
    int64: per row, the first index whose cumulative weight exceeds min(floor(uniform * total), total - 1)."""
    if weights.dtype not in (torch.int64, torch.float32):
        raise TypeError(f"weights must be int64 or float32 probabilities, got {weights.dtype}")
    return _draw(weights, None, None, None, None, None, uniform)


def nucleus_draw(keys: torch.Tensor, weights: torch.Tensor, probs: torch.Tensor, last: torch.Tensor | None,
                 ties_kept: torch.Tensor | None, min_p: torch.Tensor | None, uniform: torch.Tensor) -> torch.Tensor:
    """weighted_draw over what top-p and min-p keep. keys: [batch, n] int32 (ordered float bits); weights: [batch, n]
    int64, the fixed-point weights that top-k left; probs: [batch, n] float32, the unnormalised probabilities they
    come from; last and ties_kept: [batch] int64, top-p's threshold key and how many keys equal to it it keeps, None
    without top-p; min_p: [batch] float32 (strided or not), None without min-p; uniform: [batch] float64. Rows
    contiguous. -> [batch] int64, the index each row draws."""
    return _draw(weights, keys, probs, last, ties_kept, min_p, uniform)


def _draw(weights, keys, probs, last, ties_kept, min_p, uniform) -> torch.Tensor:
    batch, n = weights.shape
    if any(t is not None and t.stride(1) != 1 for t in (weights, keys, probs)):
        raise ValueError("weights, keys and probs rows must be contiguous")
    out = torch.empty(batch, dtype=torch.int64, device=weights.device)
    if batch:
        unread = uniform  # a pointer the kernel never reads, for an input it does without
        _draw_kernel[(batch,)](
            weights, *(unread if t is None else t for t in (keys, probs, last, ties_kept, min_p)), uniform, out, n,
            weights.stride(0), *(0 if t is None else t.stride(0) for t in (keys, probs, min_p)),
            FROM_PROBS=weights.dtype == torch.float32, HAS_TOP_P=last is not None, HAS_MIN_P=min_p is not None,
            BLOCK=min(_BLOCK, triton.next_power_of_2(n)), num_warps=8)
    return out
