"""Verifying proposals: rejection sampling keeps the target distribution (a chi-square test over many seeded draws on a
small vocabulary), for ngram's point masses and for a draft model's distributions, greedy rows accept while the argmax
agrees, and rows without a proposal draw as ops.sample does."""
import pytest
import torch

from sluice.worker.sampling.draft_sampling import draw_proposals
from sluice.worker.sampling.ops import RandomDraws, SamplingTensors, sample
from sluice.worker.sampling.speculative import NO_PROPOSAL, Drafts, ProposalRows, verify, verify_rows

VOCAB = 8
NUM_DRAWS = 40_000
LOGITS = torch.tensor([1.0, 2.5, 0.3, 2.0, -1.0, 1.7, 0.0, 2.2])
DRAFT_LOGITS = torch.tensor([2.0, 0.5, 1.0, 2.4, 0.0, -0.5, 1.9, 0.3])  # its top two are not the target's


def _tensors(num_rows: int, temperature: float, top_k: int = VOCAB, filter_width: int | None = None):
    seeds = torch.stack([torch.arange(num_rows), torch.full((num_rows,), 7)], dim=1)
    return SamplingTensors(draws=RandomDraws(
        temperature=torch.full((num_rows,), temperature), top_k=torch.full((num_rows,), top_k),
        top_p=torch.ones(num_rows), min_p=torch.zeros(num_rows), seeds=seeds,
        output_positions=torch.arange(num_rows) % 5, filter_width=filter_width))


def _target(temperature: float, top_k: int, logits: torch.Tensor = LOGITS) -> torch.Tensor:
    logits = logits / temperature
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


@pytest.mark.parametrize("temperature, top_k, filter_width", [(1.0, VOCAB, None), (0.7, VOCAB, None), (0.9, 2, 4),
                                                              (1.3, 3, 6)])
def test_rejection_sampling_with_a_draft_distribution_keeps_the_target_distribution(temperature, top_k, filter_width):
    """Proposals drawn from the draft's own processed distribution q are accepted with probability
    sum_x min(p(x), q(x)), and the tokens, accepted or drawn from the residual, are distributed as the target's p."""
    filter_width = filter_width if top_k < VOCAB else None
    proposals, draft_probs = draw_proposals(DRAFT_LOGITS.repeat(NUM_DRAWS, 1),
                                            _tensors(NUM_DRAWS, temperature, top_k, filter_width))
    draft = _target(temperature, top_k, DRAFT_LOGITS)
    assert torch.allclose(draft_probs[0].double(), draft, atol=1e-6)
    assert _chi_square_p_value(torch.bincount(proposals, minlength=VOCAB).double(), NUM_DRAWS * draft) > 1e-3
    tokens, accepted = verify(LOGITS.repeat(NUM_DRAWS, 1), _tensors(NUM_DRAWS, temperature, top_k, filter_width),
                              proposals, draft_probs)
    target = _target(temperature, top_k)
    assert _chi_square_p_value(torch.bincount(tokens, minlength=VOCAB).double(), NUM_DRAWS * target) > 1e-3
    assert torch.equal(tokens[accepted], proposals[accepted])
    expected = torch.minimum(target, draft).sum()
    assert abs(accepted.double().mean() - expected) <= 5 * (expected * (1 - expected) / NUM_DRAWS) ** 0.5 + 1e-9


def test_draft_proposals_are_seeded_and_greedy_ones_are_the_drafts_argmax():
    tensors = _tensors(200, 0.8)
    tensors.draws.temperature[::2] = 0.0
    first, probs = draw_proposals(DRAFT_LOGITS.repeat(200, 1), tensors)
    again, _ = draw_proposals(DRAFT_LOGITS.repeat(200, 1), tensors)
    assert torch.equal(first, again) and probs.shape == (200, VOCAB)
    assert (first[::2] == DRAFT_LOGITS.argmax()).all() and len(set(first[1::2].tolist())) > 2
    greedy, none = draw_proposals(DRAFT_LOGITS.repeat(3, 1), SamplingTensors())
    assert none is None and (greedy == DRAFT_LOGITS.argmax()).all()


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
    token_ids, num_accepted, row_tokens = verify_rows(LOGITS.repeat(5, 1), SamplingTensors(), rows)
    assert num_accepted.tolist() == [1, 0] and token_ids.tolist() == [1, 1]
    assert row_tokens.tolist() == [1, 1, 1, 1, 1]  # the accepted proposal, then the argmax on every other row


def test_draft_rows_place_each_requests_proposals_before_its_last_row():
    """Requests "a" (2 drafts), "b" (none) and "c" (1 draft of a width-2 table): the greedy target's argmax is 1."""
    drafts = Drafts(["a", "c"], [2, 1], torch.tensor([[1, 5], [1, 0]]), None)
    rows = ProposalRows.of_drafts(["a", "b", "c"], drafts, torch.device("cpu"))
    assert rows.row_request_ids == ["a", "a", "a", "b", "c", "c"] and rows.first_rows == [0, 3, 4]
    assert rows.proposals.tolist() == [1, 5, NO_PROPOSAL, NO_PROPOSAL, 1, NO_PROPOSAL]
    token_ids, num_accepted, _ = verify_rows(LOGITS.repeat(6, 1), SamplingTensors(), rows)
    assert num_accepted.tolist() == [1, 0, 1] and token_ids.tolist() == [1, 1, 1]
