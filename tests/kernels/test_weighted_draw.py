import pytest
import torch

from kernels.weighted_draw import weighted_draw
from worker_svc.sampling.ops import FIXED_POINT_BITS, draw, fixed_point

EDGE_UNIFORMS = [0.0, 1e-300, 0.5, 1 - 2**-53]


@pytest.mark.parametrize("n", [1, 37, 2048, 5000])
def test_draws_the_index_of_the_torch_search(device, n):
    weights = (torch.rand(16, n) ** 8 * 2**FIXED_POINT_BITS).long()  # most weights small, a few large
    weights[0] = 0  # nothing to draw: index 0, as the torch search gives
    weights[1] = 0
    weights[1, -1] = 5  # one token, the last
    weights[2, n // 2:] = 0
    uniform = torch.rand(16, dtype=torch.float64)
    uniform[-len(EDGE_UNIFORMS):] = torch.tensor(EDGE_UNIFORMS, dtype=torch.float64)
    expected = draw(weights, uniform)
    assert torch.equal(weighted_draw(weights.to(device), uniform.to(device)).cpu(), expected)
    assert expected[1] == n - 1


def test_strided_rows_and_every_crossing_of_one_row(device):
    row = torch.randint(0, 4, (1, 300), dtype=torch.int64)
    total = int(row.sum())
    weights = row.expand(total, 300)  # one row, rows 0 apart in memory, drawn at every unit of its total weight
    uniform = (torch.arange(total, dtype=torch.float64) + 0.5) / total
    expected = draw(weights.contiguous(), uniform)
    assert torch.equal(weighted_draw(weights.to(device), uniform.to(device)).cpu(), expected)
    assert expected.tolist() == [i for i, w in enumerate(row[0].tolist()) for _ in range(w)]


def test_probabilities_draw_as_their_fixed_point_weights(device):
    probs = torch.rand(16, 5000) ** 4
    probs[:, 7] = 1.0  # the row's most likely token, as unnormalised_probs leaves it
    uniform = torch.rand(16, dtype=torch.float64)
    expected = draw(fixed_point(probs), uniform)
    assert torch.equal(weighted_draw(probs.to(device), uniform.to(device)).cpu(), expected)
