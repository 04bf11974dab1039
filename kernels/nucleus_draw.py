"""The draw of a step whose filters run over the whole vocabulary, once the threshold searches are done: top-p keeps a
row's keys above its threshold key and, of the keys equal to it, the first ones in token order that still fit under
its mass limit; min-p drops the tokens less likely than min_p times the likeliest; then the draw at the row's uniform
number over what is kept, in token order. worker_svc.sampling.ops._kept_in_token_order and draw (the reference) make
the same weights and find the same token in about a dozen full-vocabulary operations; one program per row here reads
each row twice (its kept total, then a scan up to the drawn token)."""
import torch
import triton
import triton.language as tl

_BLOCK = 2048  # tokens read at once


@triton.jit
def _kept_weights(keys_ptr, weights_ptr, probs_ptr, start, offsets, n, last, ties_kept, ties_before, min_p,
                  HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr):
    """The block's kept weights, and how many of its keys equal the threshold key."""
    inside = start + offsets < n
    weights = tl.load(weights_ptr + start + offsets, mask=inside, other=0)
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
def _nucleus_draw_kernel(keys_ptr, weights_ptr, probs_ptr, last_ptr, ties_kept_ptr, min_p_ptr, uniform_ptr, out_ptr, n,
                         keys_row_stride, weights_row_stride, probs_row_stride, min_p_stride, HAS_TOP_P: tl.constexpr,
                         HAS_MIN_P: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    keys_ptr += row * keys_row_stride
    weights_ptr += row * weights_row_stride
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
        weights, num_ties = _kept_weights(keys_ptr, weights_ptr, probs_ptr, start, offsets, n, last, ties_kept,
                                          ties_before, min_p, HAS_TOP_P, HAS_MIN_P)
        total += tl.sum(weights, axis=0)
        ties_before += num_ties
    target = tl.minimum((tl.load(uniform_ptr + row) * total.to(tl.float64)).to(tl.int64), total - 1)
    before = tl.full([], 0, dtype=tl.int64)
    ties_before = tl.full([], 0, dtype=tl.int64)
    drawn = tl.full([], -1, dtype=tl.int64)
    start = 0
    while (drawn < 0) & (start < n):
        weights, num_ties = _kept_weights(keys_ptr, weights_ptr, probs_ptr, start, offsets, n, last, ties_kept,
                                          ties_before, min_p, HAS_TOP_P, HAS_MIN_P)
        crossing = tl.min(tl.where(before + tl.cumsum(weights, axis=0) > target, offsets, BLOCK), axis=0)
        drawn = tl.where(crossing < BLOCK, start + crossing, drawn).to(tl.int64)
        before += tl.sum(weights, axis=0)
        ties_before += num_ties
        start += BLOCK
    tl.store(out_ptr + row, drawn)


def nucleus_draw(keys: torch.Tensor, weights: torch.Tensor, probs: torch.Tensor, last: torch.Tensor | None,
                 ties_kept: torch.Tensor | None, min_p: torch.Tensor | None, uniform: torch.Tensor) -> torch.Tensor:
    """keys: [batch, n] int32 (ordered float bits); weights: [batch, n] int64, the fixed-point weights that top-k
    left; probs: [batch, n] float32, the unnormalised probabilities they come from; last and ties_kept: [batch]
    int64, top-p's threshold key and how many keys equal to it it keeps, None without top-p; min_p: [batch] float32
    (strided or not), None without min-p; uniform: [batch] float64. Rows contiguous. -> [batch] int64, the index
    each row draws."""
    batch, n = keys.shape
    if keys.stride(1) != 1 or weights.stride(1) != 1 or probs.stride(1) != 1:
        raise ValueError("keys, weights and probs rows must be contiguous")
    out = torch.empty(batch, dtype=torch.int64, device=keys.device)
    if batch:
        _nucleus_draw_kernel[(batch,)](
            keys, weights, probs, uniform if last is None else last, uniform if ties_kept is None else ties_kept,
            uniform if min_p is None else min_p, uniform, out, n, keys.stride(0), weights.stride(0), probs.stride(0),
            0 if min_p is None else min_p.stride(0), HAS_TOP_P=last is not None, HAS_MIN_P=min_p is not None,
            BLOCK=min(_BLOCK, triton.next_power_of_2(n)), num_warps=8)
    return out
