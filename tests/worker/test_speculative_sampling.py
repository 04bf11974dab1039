"""Verifying proposals: rejection sampling keeps the target distribution (a chi-square test over many seeded draws on a
small vocabulary), greedy rows accept while the argmax agrees, and rows without a proposal draw as ops.sample does."""
import pytest
import torch

from worker_svc.sampling.ops import RandomDraws, SamplingTensors, sample
from worker_svc.sampling.speculative import NO_PROPOSAL, ProposalRows, verify, verify_rows

VOCAB = 8
NUM_DRAWS = 40_000
LOGITS = torch.tensor([1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.0, 2.2])


def _tensors(num_rows: int, temperature: float, top_k: int = VOCAB, filter_width: int | None = None):
    seeds = torch.stack([torch.arange(num_rows), torch.full((num_rows,), 7)], dim=1)
    return SamplingTensors(draws=RandomDraws(
        temperature=torch.full((num_rows,), temperature), top_k=torch.full((num_rows,), top_k),
        top_p=torch.ones(num_rows), min_p=torch.zeros(num_rows), seeds=seeds,
        output_positions=torch.arange(num_rows) % 5, filter_width=filter_width))


def _target(temperature: float, top_k: int) -> torch.Tensor:
    logits = LOGITS / temperature
    logits[logits < logits.topk(top_k).values[-1]] = float("-inf")
    return logits.softmax(-1).double()


def _chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    kept = expected > 0
    statistic = ((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum()
    return torch.special.gammaincc(torch.tensor((int(kept.sum()) - 1) / 2.0), statistic / 2).item()


@pytest.mark.parametrize("proposal", [1, 4, 6])  # a likely token, an unlikely one, one top-k drops
@pytest.mark.parametrize("temperature, top_k, filter_width", [(1.0, VOCAB, None), (0.7, VOCAB, None),
                                                              (0.9, 2, 4), (1.3, 3, VOCAB)])
def test_rejection_sampling_keeps_the_target_distribution(proposal, temperature, top_k, filter_width):
    tensors = _tensors(NUM_DRAWS, temperature, top_k, filter_width if top_k < VOCAB else None)
    tokens, accepted = verify(LOGITS.repeat(NUM_DRAWS, 1), tensors, torch.full((NUM_DRAWS,), proposal))
    target = _target(temperature, top_k)
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    assert _chi_square_p_value(counts, NUM_DRAWS * target) > 1e-3
    assert torch.equal(accepted, tokens == proposal)  # a rejected proposal is never drawn again
    acceptance = accepted.double().mean()
    assert abs(acceptance - target[proposal]) <= 5 * (target[proposal] * (1 - target[proposal]) / NUM_DRAWS) ** 0.5


def test_seeded_verification_is_reproducible_and_rows_without_a_proposal_draw_as_sampling_does():
    proposals = torch.tensor([NO_PROPOSAL, 3, NO_PROPOSAL, 1] * 50)
    first = verify(LOGITS.repeat(200, 1), _tensors(200, 0.8), proposals)
    again = verify(LOGITS.repeat(200, 1), _tensors(200, 0.8), proposals)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    plain = sample(LOGITS.repeat(200, 1), _tensors(200, 0.8))
    free = proposals == NO_PROPOSAL
    assert torch.equal(first[0][free], plain[free]) and not first[1][free].any()


def test_greedy_rows_accept_while_the_argmax_agrees_and_then_emit_it():
    """Two requests: "a" proposes [1, 7, 1] (the argmax is 1, then 7 is wrong), "b" nothing."""
    rows = ProposalRows.of(["a", "b"], {"a": [1, 7, 1]}, torch.device("cpu"))
    assert rows.row_request_ids == ["a"] * 4 + ["b"] and rows.first_rows == [0, 4]
    token_ids, num_accepted = verify_rows(LOGITS.repeat(5, 1), SamplingTensors(), rows)
    assert num_accepted.tolist() == [1, 0] and token_ids.tolist() == [1, 1]
