import pytest
import torch

from sluice.kernels.weighted_draw import tempered_draw, weighted_draw
from sluice.worker.sampling.ops import FIXED_POINT_BITS, draw, fixed_point, unnormalised_probs

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


def test_tempered_logits_draw_as_their_fixed_point_weights(device):
    """Each row is drawn at the middle of a token's share of the reference weights, where an exp that rounds the
    last bit otherwise than torch's cannot move the draw."""
    logits = torch.randn(16, 5000) * 3
    logits[3, :4000] = float("-inf")  # masked tokens weigh nothing
    table = torch.stack([torch.rand(16) + 0.3, torch.rand(16)], dim=1)
    table[5, 0] = 0.0  # greedy: temperature 1
    temperature = table[:, 0]  # strided, as SamplingRows gathers it
    weights = fixed_point(unnormalised_probs(logits / torch.where(temperature == 0, 1.0, temperature).unsqueeze(1)))
    chosen = torch.multinomial(weights.double(), 1).squeeze(1)  # a token per row, most often a likely one
    before = (weights.cumsum(dim=1) - weights).gather(1, chosen.unsqueeze(1)).squeeze(1)
    middle = before + weights.gather(1, chosen.unsqueeze(1)).squeeze(1) // 2
    uniform = middle.double() / weights.sum(dim=1).double()
    assert torch.equal(draw(weights, uniform), chosen)
    on_device = [t.to(device) for t in (logits, logits.amax(dim=1), temperature, uniform)]
    assert torch.equal(tempered_draw(*on_device).cpu(), chosen)
