"""Batched sampling: every transform is one tensor op over the whole batch, never a Python loop per request.

Order, as in Hugging Face transformers and vLLM: penalties, logit bias, token masks (min_tokens, bad words,
allowed_token_ids, structured output) on the raw logits; greedy rows take the argmax there. Sampled rows then apply
temperature, top-k, top-p and min-p (each on what the previous one left) and draw by inverting the distribution's CDF,
in token order, at a seeded uniform number.

The filters never sort the vocabulary. When every sampled row has a small top-k they look at a few times that many of
the most likely tokens only (candidate_width); otherwise threshold searches find where each row's sorted order stops
keeping tokens. Weights are fixed-point integers, so sums are exact: either way a row keeps the same tokens with the
same weights and draws the same token, so a seeded request draws the same whatever else is in its batch, on any
device.
"""
from dataclasses import dataclass

import torch

from sluice.worker.sampling import kernel_path
from sluice.worker.sampling.most_likely import most_likely
from sluice.worker.sampling.seeded_random import seeded_uniform
from sluice.worker.sampling.threshold import ordered_keys, threshold_key

FIXED_POINT_BITS = 40  # a vocabulary below 2**23 keeps every sum of weights below 2**63
DRAW_SLICE = 1024  # draw's second level: the slice of a row it searches once the slices' sums have picked it
# NOTE: H200, int64 weights [256, 151936]: the two levels take 318 us, one cumulative sum over the rows 405 us.
TOP_K_CANDIDATES = 1024  # the most likely tokens the filters look at when every sampled row has top_k <= half of it
MIN_CANDIDATES = 64
# NOTE: H200, 256 rows of a 151,936 vocabulary (benchmarks/sampling.py), a whole sampling step at temperature 0.8,
# top-p 0.95, top-k 50: 1.13 ms with 128 candidates, 3.27 ms with 1,024 (candidate_draw compares every pair), 6.2 ms
# with the vocabulary sort.


@dataclass(slots=True)
class RandomDraws:
    """What a batch with rows that draw at random needs, one row per request (greedy rows included)."""

    temperature: torch.Tensor  # [batch] float32, 0 where greedy
    top_k: torch.Tensor | None  # [batch] int64, vocab size where disabled; None where no drawing row has one
    top_p: torch.Tensor | None  # [batch] float32; likewise
    min_p: torch.Tensor | None  # [batch] float32; likewise
    seeds: torch.Tensor  # [batch, 2] int64: the low and high 32 bits of each request's seed
    output_positions: torch.Tensor  # [batch] int64: the index of the token being sampled in the request's output
    filter_width: int | None  # None: no row filters; else how many of the most likely tokens the filters look at


@dataclass(slots=True)
class SamplingTensors:
    """One row per request that samples this step."""

    draws: RandomDraws | None = None  # None: every row is greedy
    penalties: "Penalties | None" = None
    sparse: "SparseLogits | None" = None  # logit bias; -inf on EOS and stop ids while short of min_tokens, and on
    # a bad word's last token after its others
    allowed: torch.Tensor | None = None  # [batch, vocab] bool (allowed_token_ids, structured output)


@dataclass(slots=True)
class Penalties:
    presence: torch.Tensor  # [batch] float32
    frequency: torch.Tensor  # [batch] float32
    repetition: torch.Tensor  # [batch] float32, 1 where off
    token_ids: torch.Tensor  # [batch, width] int64: the prompt and output tokens, repeated tokens and padding included
    output_counts: torch.Tensor  # [batch, width] int32: how often each entry's token was generated


@dataclass(slots=True)
class SparseLogits:
    """Values added to a few logits per row; padding entries point one past the vocabulary."""

    token_ids: torch.Tensor  # [batch, width] int64
    values: torch.Tensor  # [batch, width] float32


def sample(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """logits: [batch, vocab] float32, as they were once it returns -> sampled token ids [batch]. Penalties apply in
    place and are undone at the end, where process_logits would copy the whole batch."""
    penalties = tensors.penalties
    if penalties is None:
        return _sampled(_biased_and_masked(logits, tensors), tensors.draws)
    raw = logits.gather(1, penalties.token_ids)
    logits.scatter_(1, penalties.token_ids, _penalised(raw, penalties))
    sampled = _sampled(_biased_and_masked(logits, tensors), tensors.draws)
    logits.scatter_(1, penalties.token_ids, raw)
    return sampled


def _sampled(logits: torch.Tensor, draws: RandomDraws | None) -> torch.Tensor:
    if draws is None:
        return row_maxima(logits)[1]
    maxima, greedy_tokens = row_maxima(logits)
    uniform = seeded_uniform(draws.seeds, draws.output_positions)
    if kernel_path.runs_kernels(logits):
        return torch.where(draws.temperature == 0, greedy_tokens, _drawn_on_gpu(logits, maxima, draws, uniform))
    token_ids, weights = sampling_weights(logits, draws)
    return torch.where(draws.temperature == 0, greedy_tokens, drawn_tokens(token_ids, weights, uniform))


def row_maxima(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's largest logit and the first token that has it, as torch.max(dim=-1) finds them; on a GPU spread
    over the device (kernels.row_max), where torch reduces a row on one SM (H200, one row of 128,256: 26.4 against
    3.1 us, benchmarks/row_max.py)."""
    if not kernel_path.runs_kernels(logits):
        return logits.max(dim=-1)
    from sluice.kernels.row_max import row_max

    return row_max(logits)


def _drawn_on_gpu(logits: torch.Tensor, maxima: torch.Tensor, draws: RandomDraws,
                  uniform: torch.Tensor) -> torch.Tensor:
    """The tokens that drawn_tokens draws from sampling_weights, in fewer launches: without filters,
    kernels.weighted_draw.tempered_draw reads the logits and their rows' largest (`maxima`) and makes the weights as
    it reads them; from a top-k step's candidates, one kernel filters and draws; over the whole vocabulary,
    nucleus_draw keeps and draws after the threshold searches (tests/kernels/test_candidate_draw.py,
    test_nucleus_draw.py)."""
    from sluice.kernels.candidate_draw import candidate_draw  # every CUDA build of torch brings Triton
    from sluice.kernels.weighted_draw import tempered_draw

    if draws.filter_width is None:
        return tempered_draw(logits, maxima, draws.temperature, uniform)
    if draws.filter_width == logits.shape[-1]:
        return _drawn_over_the_vocabulary_on_gpu(_scaled(logits, draws.temperature), draws, uniform)
    values, token_ids = most_likely(logits, draws.filter_width)  # dividing keeps the order: scale the candidates
    values = _scaled(values, draws.temperature)  # alone
    probs = (values - values.amax(dim=-1, keepdim=True)).exp_()
    return candidate_draw(values, token_ids, probs, draws.top_k, draws.top_p, draws.min_p, uniform)


def candidate_width(largest_top_k: int, vocab_size: int) -> int:
    """How many of its most likely tokens a step whose drawing rows all have a small top-k looks at: a power of two,
    at least twice the largest top-k, so that the tokens tied with a row's k-th stay among them."""
    return min(max(MIN_CANDIDATES, 1 << (2 * largest_top_k - 1).bit_length()), TOP_K_CANDIDATES, vocab_size)


def sampling_weights(logits: torch.Tensor, draws: RandomDraws) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What the drawing rows draw from, given processed logits: after temperature, top-k, top-p and min-p, the
    kept tokens (None: the whole vocabulary, in token order) and their fixed-point weights. Greedy rows get
    temperature 1 here; their token is the argmax."""
    logits = _scaled(logits, draws.temperature)
    if draws.filter_width is None:
        return None, fixed_point(unnormalised_probs(logits))
    return kept_tokens(logits, draws.top_k, draws.top_p, draws.min_p, draws.filter_width)


def _scaled(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    return logits / torch.where(temperature == 0, 1.0, temperature).unsqueeze(1)


def drawn_tokens(token_ids: torch.Tensor | None, weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token each row draws at `uniform` from sampling_weights' (token_ids, weights)."""
    drawn = draw(weights, uniform)
    return drawn if token_ids is None else token_ids.gather(1, drawn.unsqueeze(1)).squeeze(1)


def unnormalised_probs(logits: torch.Tensor) -> torch.Tensor:
    """exp(logit - the row's largest): each row's probabilities up to one factor."""
    return (logits - logits.amax(dim=-1, keepdim=True)).exp_()


def fixed_point(probs: torch.Tensor) -> torch.Tensor:
    """Unnormalised probabilities (at most 1) as int64 multiples of 2**-FIXED_POINT_BITS: their sums are exact in any
    order, on any device."""
    return probs.mul(2.0**FIXED_POINT_BITS).long()


def draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The first index whose cumulative weight exceeds `uniform` times the total (a weight of 0 is never drawn).
    weights: [batch, n] int64. A wide row is searched in two levels, slices' sums then one slice, rather than by a
    cumulative sum over the whole row; on a GPU, kernels.weighted_draw sums every row's chunks at once, then scans the
    chunk where the row crosses. The sums are exact, so all three find the same index."""
    if kernel_path.runs_kernels(weights):
        from sluice.kernels.weighted_draw import weighted_draw  # every CUDA build of torch brings Triton
        return weighted_draw(weights, uniform)
    batch, n = weights.shape
    num_slices = n // DRAW_SLICE
    if num_slices < 2:
        return _first_crossing(weights.cumsum(dim=-1), uniform)
    whole = num_slices * DRAW_SLICE
    slice_sums = torch.cat([weights[:, :whole].view(batch, num_slices, DRAW_SLICE).sum(dim=-1),
                            weights[:, whole:].sum(dim=-1, keepdim=True)], dim=1)
    slice_cdf = slice_sums.cumsum(dim=-1)
    target = _target(uniform, slice_cdf[:, -1])
    chosen = torch.searchsorted(slice_cdf, target, right=True)  # [batch, 1]
    before = (slice_cdf - slice_sums).gather(1, chosen)
    positions = chosen * DRAW_SLICE + torch.arange(DRAW_SLICE, device=weights.device)
    inside = weights.gather(1, positions.clamp(max=n - 1)).masked_fill_(positions >= n, 0)
    offset = torch.searchsorted(inside.cumsum(dim=-1), target - before, right=True)
    return (chosen * DRAW_SLICE + offset).squeeze(1)


def _first_crossing(cdf: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    return torch.searchsorted(cdf, _target(uniform, cdf[:, -1]), right=True).squeeze(1)


def _target(uniform: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The cumulative weight [batch, 1] that the drawn index's must exceed."""
    return torch.minimum((uniform * total).long(), total - 1).unsqueeze(1)


def process_logits(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """The logits with every transform applied, a new tensor where one applies: the raw logits stay for logprobs."""
    if tensors.penalties is not None:
        logits = apply_penalties(logits, tensors.penalties)
    return _biased_and_masked(logits, tensors)


def _biased_and_masked(logits: torch.Tensor, tensors: SamplingTensors) -> torch.Tensor:
    """The logits after logit bias and token masks, a new tensor where either applies."""
    if tensors.sparse is not None:
        added = logits.new_zeros(logits.shape[0], logits.shape[1] + 1)
        added.scatter_add_(1, tensors.sparse.token_ids, tensors.sparse.values)
        logits = logits + added[:, :-1]
    if tensors.allowed is not None:
        logits = logits.masked_fill(~tensors.allowed, float("-inf"))
    return logits


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """Repetition penalty over prompt and output tokens (divides positive logits, multiplies negative ones), then
    OpenAI's presence and frequency penalties over output tokens: on the rows' history entries only. A token listed
    twice gets the same value twice."""
    return logits.scatter(1, penalties.token_ids, _penalised(logits.gather(1, penalties.token_ids), penalties))


def _penalised(seen: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """The logits `seen` of the rows' history entries, penalised."""
    counts = penalties.output_counts
    repetition = penalties.repetition.unsqueeze(1)
    penalised = torch.where(seen > 0, seen / repetition, seen * repetition)
    penalised -= penalties.frequency.unsqueeze(1) * counts + penalties.presence.unsqueeze(1) * (counts > 0)
    return penalised


def kept_tokens(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                min_p: torch.Tensor | None, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What top-k, then top-p over the tokens top-k kept, then min-p keep: token ids [batch, width], ascending, and
    their fixed-point unnormalised probabilities (0 where dropped). Top-k keeps every token tied with the k-th, as
    Hugging Face does; top-p keeps the most likely tokens, ties in token order, until the ones before weigh top_p of
    the total; the most likely token always stays (top_p > 0, min_p <= 1). A filter is None where no row uses it.
    width: how many of the most likely tokens to look at, at least twice every drawing row's top_k, or the vocabulary,
    which no filter sorts."""
    vocab_size = logits.shape[-1]
    if width == vocab_size:
        return torch.arange(vocab_size, device=logits.device).expand_as(logits), \
            _kept_in_token_order(logits, top_k, top_p, min_p)
    values, token_ids = most_likely(logits, width)  # put in order below, ties by token id
    token_ids, by_id = token_ids.sort(dim=-1)
    values, by_value = values.gather(1, by_id).sort(dim=-1, descending=True, stable=True)
    token_ids = token_ids.gather(1, by_value)
    # -- most likely first, ties by token id
    probs = (values - values[:, :1]).exp_()
    probs.masked_fill_(values < values.gather(1, top_k.clamp(max=width).sub(1).unsqueeze(1)), 0.0)
    weights = fixed_point(probs)
    if top_p is not None:
        cdf = weights.cumsum(dim=-1)
        weights.masked_fill_(cdf - weights >= _mass_limit(top_p, cdf[:, -1]).unsqueeze(1), 0)
    if min_p is not None:
        weights.masked_fill_(probs < min_p.unsqueeze(1), 0)
    # -- back to token order, the order in which a row with no filter draws over the whole vocabulary
    token_ids, by_id = token_ids.sort(dim=-1)
    return token_ids, weights.gather(1, by_id)


def _kept_in_token_order(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                         min_p: torch.Tensor | None) -> torch.Tensor:
    """kept_tokens' weights over the whole vocabulary, in token order, from threshold searches instead of a sort."""
    keys, probs, weights = _after_top_k(logits, top_k)
    if top_p is not None:
        limit = _mass_limit(top_p, weights.sum(dim=-1))
        last, above, tied = threshold_key(keys, weights, limit)
        ties = keys == last.unsqueeze(1)
        tie_rank = ties.cumsum(dim=-1)
        num_ties_kept = _num_ties_kept(limit, above, tied, tie_rank[:, -1])
        dropped = (keys < last.unsqueeze(1)) | (tie_rank > num_ties_kept.unsqueeze(1)) & ties
        weights.masked_fill_(dropped, 0)
    if min_p is not None:
        weights.masked_fill_(probs < min_p.unsqueeze(1), 0)
    return weights


def _drawn_over_the_vocabulary_on_gpu(logits: torch.Tensor, draws: RandomDraws, uniform: torch.Tensor) -> torch.Tensor:
    """drawn_tokens over _kept_in_token_order's weights: the threshold searches, then one kernel keeps and draws."""
    from sluice.kernels.threshold_search import threshold_search  # every CUDA build of torch brings Triton
    from sluice.kernels.weighted_draw import nucleus_draw

    keys, probs, weights = _after_top_k(logits, draws.top_k)
    last = num_ties_kept = None
    if draws.top_p is not None:
        limit = _mass_limit(draws.top_p, weights.sum(dim=-1))
        last, above, tied, num_tied = threshold_search(keys, weights, limit)
        num_ties_kept = _num_ties_kept(limit, above, tied, num_tied)
    return nucleus_draw(keys, weights, probs, last, num_ties_kept, draws.min_p, uniform)


def _after_top_k(logits: torch.Tensor, top_k: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The logits' keys, their unnormalised probabilities with 0 where top-k drops a token, and their fixed-point
    weights."""
    keys = ordered_keys(logits)
    probs = unnormalised_probs(logits)
    if top_k is not None:
        kth, _, _ = threshold_key(keys, None, top_k.clamp(max=logits.shape[-1]))
        probs.masked_fill_(keys < kth.unsqueeze(1), 0.0)
    return keys, probs, fixed_point(probs)


def _num_ties_kept(limit: torch.Tensor, above: torch.Tensor, tied: torch.Tensor,
                   num_tied: torch.Tensor) -> torch.Tensor:
    """How many of the keys equal to top-p's threshold key it keeps: the ties before each weigh under the limit."""
    return (limit - above - 1) // (tied // num_tied) + 1


def _mass_limit(top_p: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The smallest weight that the tokens before a token must reach for top-p to drop it (top_p 1 drops none)."""
    return torch.where(top_p < 1, (top_p.double() * total).ceil_().long(), total)
