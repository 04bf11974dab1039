"""A draft model's proposals, drawn as ops.sample draws: from the request's processed distribution (its masks,
temperature, top-k, top-p and min-p) over the draft's logits, at a uniform of the seed's second stream, so that the
draw is independent of the uniform that verifies it. Returned with that distribution q, which verification needs."""
import torch

from sluice.worker.sampling.ops import SamplingTensors, drawn_tokens, process_logits, row_maxima, sampling_weights
from sluice.worker.sampling.seeded_random import seeded_uniform

_DRAFT_STREAM = 0x9E3779B9  # mixed into the seed's high word


def draw_proposals(logits: torch.Tensor, tensors: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits: [rows, vocab] the draft's, raw. Returns each row's proposal and the float32 [rows, vocab]
    distribution it was drawn from (None when every row is greedy: its proposal is the argmax)."""
    logits = process_logits(logits, tensors)
    greedy_tokens = row_maxima(logits)[1]
    draws = tensors.draws
    if draws is None:
        return greedy_tokens, None
    token_ids, weights = sampling_weights(logits, draws)
    drawn = drawn_tokens(token_ids, weights, seeded_uniform(draws.seeds, draws.output_positions, _DRAFT_STREAM))
    probs = (weights.double() / weights.sum(dim=-1, keepdim=True)).float()
    if token_ids is not None:
        probs = probs.new_zeros(logits.shape).scatter_(1, token_ids, probs)
    return torch.where(draws.temperature == 0, greedy_tokens, drawn), probs
