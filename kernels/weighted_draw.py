"""The draw at a uniform number from integer weights: the first index whose cumulative weight exceeds the uniform's
share of the row's total, the index that sluice.worker.sampling.ops.draw (the reference) finds from slices' sums and one
slice. Two launches instead of twenty: one program per chunk of a row sums the chunk, then one program per row picks
the chunk where the cumulative weight crosses and scans that chunk alone. Integer sums are exact, so both find the
same index.

tempered_draw reads processed logits and makes their fixed-point weights as it reads them, as
sluice.worker.sampling.ops.sampling_weights does without filters (temperature, exp less the row's largest, fixed point),
where torch would write and read the row five times over. nucleus_draw also keeps, as it reads, what the filters
over the whole vocabulary keep once the threshold searches are done (sluice.worker.sampling.ops._kept_in_token_order,
in about a dozen full-vocabulary operations): top-p the keys above its threshold key and, of those equal to it, the
first ones in token order that still fit under its mass limit; min-p the tokens at least min_p times as likely as
the likeliest. Keys equal to the threshold key come from equal logits, so they weigh the same: a chunk's share of them
is a count times that weight."""
import torch
import triton
import triton.language as tl

_CHUNK = 2048  # weights a program sums
_FIXED_POINT_ONE = tl.constexpr(2.0**40)  # sluice.worker.sampling.ops.FIXED_POINT_BITS


@triton.jit
def _tempering(temperature_ptr, maxima_ptr, row, temperature_stride, FROM_LOGITS: tl.constexpr):
    """A row's temperature (1 where greedy) and its largest logit divided by it."""
    temperature = 1.0
    shift = 0.0
    if FROM_LOGITS:
        temperature = tl.load(temperature_ptr + row * temperature_stride)
        temperature = tl.where(temperature == 0, 1.0, temperature)
        shift = tl.math.div_rn(tl.load(maxima_ptr + row), temperature)
    return temperature, shift


@triton.jit
def _weights(weights_ptr, keys_ptr, probs_ptr, start, offsets, n, last, min_p, temperature, shift,
             FROM_LOGITS: tl.constexpr, HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr):
    """A chunk's weights after min-p, which of them top-p keeps whatever the tie rule says (keys above its threshold
    key) and which are tied with that key."""
    inside = start + offsets < n
    if FROM_LOGITS:
        logits = tl.load(weights_ptr + start + offsets, mask=inside, other=float("-inf"))
        weights = (tl.exp(tl.math.div_rn(logits, temperature) - shift) * _FIXED_POINT_ONE).to(tl.int64)
    else:
        weights = tl.load(weights_ptr + start + offsets, mask=inside, other=0)
    if HAS_MIN_P:
        probs = tl.load(probs_ptr + start + offsets, mask=inside, other=0.0)
        weights = tl.where(probs < min_p, 0, weights)
    if HAS_TOP_P:
        keys = tl.load(keys_ptr + start + offsets, mask=inside, other=0)
        above = keys > last
        ties = (keys == last) & inside
    else:
        above = inside
        ties = offsets < 0
    return weights, above, ties


@triton.jit
def _chunk_sums_kernel(weights_ptr, keys_ptr, probs_ptr, last_ptr, min_p_ptr, temperature_ptr, maxima_ptr,
                       above_sums_ptr, tie_counts_ptr, tie_sums_ptr, n, weights_row_stride, keys_row_stride,
                       probs_row_stride, min_p_stride, temperature_stride, FROM_LOGITS: tl.constexpr,
                       HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    out = row * tl.num_programs(1) + chunk
    last = tl.full([], 0, dtype=tl.int64)
    min_p = 0.0
    if HAS_TOP_P:
        last = tl.load(last_ptr + row)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row * min_p_stride)
    temperature, shift = _tempering(temperature_ptr, maxima_ptr, row, temperature_stride, FROM_LOGITS)
    weights, above, ties = _weights(weights_ptr + row * weights_row_stride, keys_ptr + row * keys_row_stride,
                                    probs_ptr + row * probs_row_stride, chunk * CHUNK, tl.arange(0, CHUNK), n, last,
                                    min_p, temperature, shift, FROM_LOGITS, HAS_TOP_P, HAS_MIN_P)
    tl.store(above_sums_ptr + out, tl.sum(tl.where(above, weights, 0), axis=0))
    if HAS_TOP_P:
        tl.store(tie_counts_ptr + out, tl.sum(ties.to(tl.int64), axis=0))
        tl.store(tie_sums_ptr + out, tl.sum(tl.where(ties, weights, 0), axis=0))


@triton.jit
def _draw_kernel(weights_ptr, keys_ptr, probs_ptr, last_ptr, ties_kept_ptr, min_p_ptr, temperature_ptr, maxima_ptr,
                 uniform_ptr, above_sums_ptr, tie_counts_ptr, tie_sums_ptr, out_ptr, n, num_chunks, weights_row_stride,
                 keys_row_stride, probs_row_stride, min_p_stride, temperature_stride, FROM_LOGITS: tl.constexpr,
                 HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS)
    sums_at = row * num_chunks + chunks
    inside = chunks < num_chunks
    kept = tl.load(above_sums_ptr + sums_at, mask=inside, other=0)
    last = tl.full([], 0, dtype=tl.int64)
    ties_kept = tl.full([], 0, dtype=tl.int64)
    ties_before = tl.zeros([CHUNKS], dtype=tl.int64)
    min_p = 0.0
    if HAS_TOP_P:
        last = tl.load(last_ptr + row)
        ties_kept = tl.load(ties_kept_ptr + row)
        tie_counts = tl.load(tie_counts_ptr + sums_at, mask=inside, other=0)
        tie_sums = tl.load(tie_sums_ptr + sums_at, mask=inside, other=0)
        ties_before = tl.cumsum(tie_counts, axis=0) - tie_counts
        kept_ties = tl.minimum(tl.maximum(ties_kept - ties_before, 0), tie_counts)
        kept += tl.where(tie_counts > 0, kept_ties * (tie_sums // tl.maximum(tie_counts, 1)), 0)
    if HAS_MIN_P:
        min_p = tl.load(min_p_ptr + row * min_p_stride)
    kept_up_to = tl.cumsum(kept, axis=0)
    total = tl.sum(kept, axis=0)
    target = tl.minimum((tl.load(uniform_ptr + row) * total.to(tl.float64)).to(tl.int64), total - 1)
    chunk = tl.sum(((kept_up_to <= target) & inside).to(tl.int32), axis=0)  # the first chunk that crosses it
    chosen = chunks == chunk
    before = tl.sum(tl.where(chosen, kept_up_to - kept, 0), axis=0)
    offsets = tl.arange(0, CHUNK)
    temperature, shift = _tempering(temperature_ptr, maxima_ptr, row, temperature_stride, FROM_LOGITS)
    weights, above, ties = _weights(weights_ptr + row * weights_row_stride, keys_ptr + row * keys_row_stride,
                                    probs_ptr + row * probs_row_stride, chunk * CHUNK, offsets, n, last, min_p,
                                    temperature, shift, FROM_LOGITS, HAS_TOP_P, HAS_MIN_P)
    if HAS_TOP_P:
        tie_rank = tl.sum(tl.where(chosen, ties_before, 0), axis=0) + tl.cumsum(ties.to(tl.int64), axis=0)
        above = above | (ties & (tie_rank <= ties_kept))
    weights = tl.where(above, weights, 0)
    crossing = tl.min(tl.where(before + tl.cumsum(weights, axis=0) > target, offsets, CHUNK), axis=0)
    tl.store(out_ptr + row, chunk * CHUNK + crossing)


def weighted_draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """weights: [batch, n] int64 >= 0, rows contiguous; uniform: [batch] float64 in [0, 1). -> [batch] int64: per
    row, the first index whose cumulative weight exceeds min(floor(uniform * total), total - 1)."""
    return _draw(weights, uniform)


def tempered_draw(logits: torch.Tensor, maxima: torch.Tensor, temperature: torch.Tensor,
                  uniform: torch.Tensor) -> torch.Tensor:
    """weighted_draw over the fixed-point weights of exp(logit / t - largest / t). logits: [batch, n] float32, rows
    contiguous; maxima: [batch] float32, each row's largest logit; temperature: [batch] float32 (strided or not), t, 1
    where 0 (greedy); uniform: [batch] float64."""
    return _draw(logits, uniform, temperature=temperature, maxima=maxima)


def nucleus_draw(keys: torch.Tensor, weights: torch.Tensor, probs: torch.Tensor, last: torch.Tensor | None,
                 ties_kept: torch.Tensor | None, min_p: torch.Tensor | None, uniform: torch.Tensor) -> torch.Tensor:
    """weighted_draw over what top-p and min-p keep. keys: [batch, n] int32 (ordered float bits); weights: [batch, n]
    int64, the fixed-point weights that top-k left; probs: [batch, n] float32, the unnormalised probabilities they
    come from; last and ties_kept: [batch] int64, top-p's threshold key and how many keys equal to it it keeps, None
    without top-p; min_p: [batch] float32 (strided or not), None without min-p; uniform: [batch] float64. Rows
    contiguous. -> [batch] int64, the index each row draws."""
    return _draw(weights, uniform, keys, probs, last, ties_kept, min_p)


def _draw(weights, uniform, keys=None, probs=None, last=None, ties_kept=None, min_p=None, temperature=None,
          maxima=None) -> torch.Tensor:
    batch, n = weights.shape
    if any(t is not None and t.stride(1) != 1 for t in (weights, keys, probs)):
        raise ValueError("weights, keys and probs rows must be contiguous")
    if weights.dtype != (torch.float32 if maxima is not None else torch.int64):
        raise TypeError(f"weights must be int64, logits float32: got {weights.dtype}")
    out = torch.empty(batch, dtype=torch.int64, device=weights.device)
    if not batch:
        return out
    chunk = min(_CHUNK, triton.next_power_of_2(n))
    num_chunks = triton.cdiv(n, chunk)
    above_sums, tie_counts, tie_sums = (torch.empty(batch, num_chunks, dtype=torch.int64, device=weights.device)
                                        for _ in range(3))
    unread = uniform  # a pointer the kernels never read, for an input they do without
    inputs = [unread if t is None else t for t in (keys, probs, last)]
    per_row = [unread if t is None else t for t in (min_p, temperature, maxima)]
    strides = [weights.stride(0), *(0 if t is None else t.stride(0) for t in (keys, probs, min_p, temperature))]
    variant = {"FROM_LOGITS": maxima is not None, "HAS_TOP_P": last is not None, "HAS_MIN_P": min_p is not None,
               "CHUNK": chunk}
    _chunk_sums_kernel[(batch, num_chunks)](weights, *inputs, *per_row, above_sums, tie_counts, tie_sums, n, *strides,
                                            **variant, num_warps=8)
    _draw_kernel[(batch,)](weights, *inputs, unread if ties_kept is None else ties_kept, *per_row, uniform,
                           above_sums, tie_counts, tie_sums, out, n, num_chunks, *strides, **variant,
                           CHUNKS=triton.next_power_of_2(num_chunks), num_warps=8)
    return out
