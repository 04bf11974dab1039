import pytest
import torch

from sluice.kernels.logprob_stats import logprob_stats

VOCAB = 5000  # a whole chunk and a part


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
    token_ids = torch.tensor([0, 17, 4200, VOCAB - 1], device=device)
    normaliser, ranks, top_values, top_ids = logprob_stats(logits, token_ids, 8)
    torch.testing.assert_close(normaliser, logits.logsumexp(dim=-1))
    assert torch.equal(ranks, (logits > logits.gather(1, token_ids.unsqueeze(1))).sum(dim=1) + 1)
    in_order = logits.sort(dim=-1, descending=True, stable=True)  # ties: the lowest id first
    assert torch.equal(top_values, in_order.values[:, :8]) and torch.equal(top_ids, in_order.indices[:, :8])


def test_top_tokens_crowded_into_few_columns(device):
    logits = torch.randn(3, VOCAB, device=device)
    logits[0, 40:60] = torch.arange(20, device=device) + 10.0  # all 20 top tokens in one run of columns
    logits[1, 4096 + 7] = 60.0  # the largest in the second chunk, the next ones in the first chunk's last columns
    logits[1, 4078:4096] = 40.0 + torch.arange(18, device=device)
    logits[2, ::97] = 30.0  # tied tops spread over every group
    token_ids = torch.zeros(3, dtype=torch.int64, device=device)
    _, _, top_values, top_ids = logprob_stats(logits, token_ids, 20)
    expected_values, expected_ids = logits.topk(20, dim=-1)
    assert torch.equal(top_values, expected_values)
    assert torch.equal(top_ids[:2], expected_ids[:2])
    assert torch.equal(logits[2, top_ids[2]], top_values[2]) and len(set(top_ids[2].tolist())) == 20  # tied
