import pytest
import torch

from sluice.worker.sampling.most_likely import GROUP, most_likely

DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])


def _check(logits: torch.Tensor, width: int) -> None:
    values, token_ids = most_likely(logits, width)
    expected = logits.topk(width, dim=-1).values
    assert torch.equal(values.sort(dim=-1, descending=True).values, expected)
    assert torch.equal(logits.gather(1, token_ids), values)
    assert all(len(set(row)) == width for row in token_ids.tolist())


@DEVICES
@pytest.mark.parametrize("width", [64, 128])
def test_the_largest_logits_of_each_row(device, width):
    logits = torch.randn(8, GROUP * 4 * width * 2, device=device) * 3
    logits[0, :width] += 100  # every one of them in one contiguous run
    logits[3].view(GROUP, -1)[:, :4] += 100  # or in four groups
    logits[1] = logits[1].mul(2).round()  # many ties, across groups and at the last value kept
    logits[2, 1::2] = float("-inf")
    _check(logits, width)


@DEVICES
def test_a_vocabulary_of_few_groups_or_part_of_one(device):
    _check(torch.randn(4, GROUP * 4 * 64 - 1, device=device), 64)
    _check(torch.randn(4, GROUP * 4 * 64 - GROUP, device=device), 64)
