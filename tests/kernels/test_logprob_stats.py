import pytest
import torch

from kernels.logprob_stats import logprob_stats

VOCAB = 5000  # two whole chunks and a part


@pytest.mark.parametrize("num_top", [0, 1, 5, 20])
def test_matches_torch_reductions(device, num_top):
    logits = torch.randn(7, VOCAB, device=device) * 4
    token_ids = torch.randint(0, VOCAB, (7,), device=device)
    token_ids[0] = logits[0].argmax()  # rank 1
    token_ids[1] = VOCAB - 1  # in the last, partial chunk
    normaliser, ranks, top_values, top_ids = logprob_stats(logits, token_ids, num_top)
    torch.testing.assert_close(normaliser, logits.logsumexp(dim=-1))
    chosen = logits.gather(1, token_ids.unsqueeze(1))
    assert torch.equal(ranks, (logits > chosen).sum(dim=1) + 1) and ranks[0] == 1
    expected_values, expected_ids = logits.topk(num_top, dim=-1)
    assert torch.equal(top_values, expected_values) and torch.equal(top_ids, expected_ids)


def test_ties_give_the_tied_tokens_and_strided_rows_are_read_in_place(device):
    table = (torch.randn(4, 2 * VOCAB, device=device) * 2).round_()  # many ties, across chunks too
    logits = table[:, :VOCAB]  # rows VOCAB apart in memory
    token_ids = torch.tensor([0, 17, 2100, VOCAB - 1], device=device)
    normaliser, ranks, top_values, top_ids = logprob_stats(logits, token_ids, 8)
    torch.testing.assert_close(normaliser, logits.logsumexp(dim=-1))
    assert torch.equal(ranks, (logits > logits.gather(1, token_ids.unsqueeze(1))).sum(dim=1) + 1)
    assert torch.equal(top_values, logits.topk(8, dim=-1).values)
    assert torch.equal(logits.gather(1, top_ids), top_values) and all(len(set(row)) == 8 for row in top_ids.tolist())
