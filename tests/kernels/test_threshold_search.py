import pytest
import torch

from sluice.kernels.threshold_search import threshold_search
from sluice.worker.sampling.ops import fixed_point, unnormalised_probs
from sluice.worker.sampling.threshold import ordered_keys, threshold_key

N = 3000  # five whole blocks of 512 and a part


def _rows(num_rows: int) -> torch.Tensor:
    values = (torch.randn(num_rows, N) * 3).mul_(8).round_().div_(8)  # many ties
    values[0, :10] = float("-inf")
    values[1] = 0.25  # one value only
    values[2, 5] = -0.0  # the same key as 0.0
    values[2, 6] = 0.0
    return values


@pytest.mark.parametrize("weighted", [True, False])
def test_finds_the_key_of_the_radix_search(device, weighted):
    values = _rows(12)
    keys = ordered_keys(values)
    weights = fixed_point(unnormalised_probs(values)) if weighted else None
    total = weights.sum(dim=1) if weighted else torch.full((12,), N)
    limit = (torch.rand(12, dtype=torch.float64) * total).long().clamp_(min=1)
    limit[3], limit[4] = 1, total[4]  # only the largest key stays; every key of positive weight
    expected = threshold_key(keys, weights, limit)
    *got, count = threshold_search(keys.to(device), None if weights is None else weights.to(device), limit.to(device))
    for name, want, have in zip(("key", "above", "tied"), expected, got):
        assert torch.equal(have.cpu(), want), name
    assert expected[0][3] == keys[3].max()
    assert torch.equal(count.cpu(), (keys == expected[0].unsqueeze(1)).sum(dim=1))


def test_strided_rows(device):
    values = _rows(4)
    keys = ordered_keys(torch.cat([values, values], dim=1))[:, :N]  # rows 2N apart
    limit = torch.tensor([1, 10, 100, 1000])
    expected = threshold_key(keys.contiguous(), None, limit)
    got = threshold_search(keys.to(device), None, limit.to(device))[:3]
    assert all(torch.equal(have.cpu(), want) for want, have in zip(expected, got))
