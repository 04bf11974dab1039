"""draw's two-level search against the cumulative sum over the whole row that it stands in for."""
import pytest
import torch

from sluice.worker.sampling.ops import DRAW_SLICE, draw


def _one_pass_draw(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    cdf = weights.cumsum(dim=-1)
    target = torch.minimum((uniform * cdf[:, -1]).long(), cdf[:, -1] - 1).unsqueeze(1)
    return torch.searchsorted(cdf, target, right=True).squeeze(1)


@pytest.mark.parametrize("vocab_size", [DRAW_SLICE - 1, 3 * DRAW_SLICE, 5 * DRAW_SLICE + 77])
def test_draw_finds_the_index_a_cumulative_sum_over_the_row_finds(vocab_size):
    generator = torch.Generator().manual_seed(vocab_size)
    weights = (torch.rand(64, vocab_size, generator=generator) ** 8 * 2**40).long()
    weights[:8, :-3] = 0  # rows whose whole weight is in the ragged last slice
    edge = min(DRAW_SLICE, vocab_size - 1)
    weights[8:16] = 0
    weights[8:16, edge - 1:edge + 1] = 1  # a row's weight on both sides of a slice boundary
    weights[16:24, ::DRAW_SLICE // 2] = 0  # zeros at slice starts, never drawn
    uniform = torch.cat([torch.rand(60, generator=generator, dtype=torch.float64),
                         torch.tensor([0.0, 0.5, 1 - 2**-53, 0.25], dtype=torch.float64)])
    drawn = draw(weights, uniform)
    assert torch.equal(drawn, _one_pass_draw(weights, uniform))
    assert (weights.gather(1, drawn.unsqueeze(1)) > 0).all()
