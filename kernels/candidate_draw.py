"""The draw of a sampling step whose rows look at their most likely tokens only (sluice.worker.sampling.ops.kept_tokens
then drawn_tokens, the reference): top-k, then top-p over what top-k kept, then min-p, then the draw in token order at
each row's uniform number, in one program per row instead of some thirty tensor operations.

The candidates come in any order. Where the torch path sorts them, each candidate here counts, against every other,
the ones before it in the order it needs (value descending, ties by token id; or token id): O(width**2) comparisons
per row, cheap for the widths a top-k step uses. Weights are the same fixed-point integers as the torch path's, from
the same probabilities, so both keep the same tokens and draw the same one."""
import torch
import triton
import triton.language as tl

_FIXED_POINT_ONE = tl.constexpr(2.0**40)  # sluice.worker.sampling.ops.FIXED_POINT_BITS
_CHUNK = 16  # the other candidates compared at once


@triton.jit
def _candidate_draw_kernel(values_ptr, ids_ptr, probs_ptr, top_k_ptr, top_p_ptr, min_p_ptr, uniform_ptr, scratch_ptr,
                           out_ptr, width, row_stride, top_k_stride, top_p_stride, min_p_stride,
                           HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr,
                           BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    values_ptr += row * row_stride
    ids_ptr += row * row_stride
    scratch_ptr += row * BLOCK
    i = tl.arange(0, BLOCK)
    value = tl.load(values_ptr + i, mask=i < width, other=float("-inf"))
    token = tl.load(ids_ptr + i, mask=i < width, other=0)
    prob = tl.load(probs_ptr + row * row_stride + i, mask=i < width, other=0.0)

    # -- top-k keeps a token unless k others are more likely (ties with the k-th stay)
    if HAS_TOP_K:
        num_above = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, width, CHUNK):
            j = start + tl.arange(0, CHUNK)
            other = tl.load(values_ptr + j, mask=j < width, other=float("-inf"))
            num_above += tl.sum((other[None, :] > value[:, None]).to(tl.int32), axis=1)
        prob = tl.where(num_above < tl.load(top_k_ptr + row * top_k_stride), prob, 0.0)
    weight = (prob * _FIXED_POINT_ONE).to(tl.int64)

    # -- top-p drops a token once the tokens before it (most likely first, ties by id) weigh top_p of the total
    if HAS_TOP_P:
        tl.store(scratch_ptr + i, weight)
        tl.debug_barrier()
        weight_before = tl.zeros([BLOCK], dtype=tl.int64)
        for start in range(0, width, CHUNK):
            j = start + tl.arange(0, CHUNK)
            other = tl.load(values_ptr + j, mask=j < width, other=float("-inf"))
            other_token = tl.load(ids_ptr + j, mask=j < width, other=0)
            other_weight = tl.load(scratch_ptr + j, mask=j < width, other=0)
            before = (other[None, :] > value[:, None]) | \
                ((other[None, :] == value[:, None]) & (other_token[None, :] < token[:, None]))
            weight_before += tl.sum(tl.where(before, other_weight[None, :], 0), axis=1)
        total = tl.sum(weight, axis=0)
        top_p = tl.load(top_p_ptr + row * top_p_stride)
        limit = tl.where(top_p < 1, tl.math.ceil(top_p.to(tl.float64) * total.to(tl.float64)).to(tl.int64), total)
        weight = tl.where(weight_before < limit, weight, 0)
        tl.debug_barrier()

    if HAS_MIN_P:
        weight = tl.where(prob < tl.load(min_p_ptr + row * min_p_stride), 0, weight)

    # -- the draw: the first token, in token order, whose cumulative weight exceeds the uniform's share of the total
    tl.store(scratch_ptr + i, weight)
    tl.debug_barrier()
    weight_up_to = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, width, CHUNK):
        j = start + tl.arange(0, CHUNK)
        other_token = tl.load(ids_ptr + j, mask=j < width, other=0)
        other_weight = tl.load(scratch_ptr + j, mask=j < width, other=0)
        weight_up_to += tl.sum(tl.where(other_token[None, :] <= token[:, None], other_weight[None, :], 0), axis=1)
    total = tl.sum(weight, axis=0)
    target = tl.minimum((tl.load(uniform_ptr + row) * total.to(tl.float64)).to(tl.int64), total - 1)
    drawn = (weight > 0) & (weight_up_to > target) & (weight_up_to - weight <= target)
    tl.store(out_ptr + row, tl.max(tl.where(drawn, token, -1), axis=0))


def candidate_draw(values: torch.Tensor, token_ids: torch.Tensor, probs: torch.Tensor, top_k: torch.Tensor | None,
                   top_p: torch.Tensor | None, min_p: torch.Tensor | None, uniform: torch.Tensor) -> torch.Tensor:
    """values: [batch, width] float32, each row's candidates' temperature-scaled logits, in any order; token_ids:
    [batch, width] int64, theirs; probs: [batch, width] float32, exp(value - the row's largest); top_k [batch] int64,
    top_p and min_p [batch] float32, each None where no row uses it, and strided or not; uniform: [batch] float64.
    -> [batch] int64, the token each row draws."""
    batch, width = values.shape
    if not (values.is_contiguous() and token_ids.is_contiguous() and probs.is_contiguous()):
        raise ValueError("values, token_ids and probs must be contiguous")
    out = torch.empty(batch, dtype=torch.int64, device=values.device)
    if batch:
        block = triton.next_power_of_2(width)
        scratch = torch.empty(batch, block, dtype=torch.int64, device=values.device)
        filters = [uniform if f is None else f for f in (top_k, top_p, min_p)]  # unread where a filter is off
        _candidate_draw_kernel[(batch,)](
            values, token_ids, probs, *filters, uniform, scratch, out, width, values.stride(0),
            *(f.stride(0) for f in filters), HAS_TOP_K=top_k is not None, HAS_TOP_P=top_p is not None,
            HAS_MIN_P=min_p is not None, BLOCK=block, CHUNK=min(_CHUNK, block), num_warps=8)
    return out
