"""draw's two-level search and largest's two-stage top-k against the one-pass operations they stand in for."""
import pytest
import torch

from worker_svc.sampling.ops import DRAW_SLICE, TOP_K_SLICES, draw, largest


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


@pytest.mark.parametrize("vocab_size, k", [(TOP_K_SLICES * 40 + 13, 5), (TOP_K_SLICES * 40, 10), (300, 5),
                                           (TOP_K_SLICES * 40, 0)])
def test_largest_gives_the_values_and_tokens_of_topk(vocab_size, k):
    generator = torch.Generator().manual_seed(k)
    values = torch.randn(16, vocab_size, generator=generator)
    values[0, -5:] = 100.0  # the top tokens in the ragged tail
    values[1, :: TOP_K_SLICES * 2] = 50.0 + torch.arange(len(range(0, vocab_size, TOP_K_SLICES * 2)))
    top, ids = largest(values, k)
    expected, _ = values.topk(k, dim=-1)
    assert torch.equal(top, expected)
    assert torch.equal(values.gather(1, ids), top)
    assert all(len(set(row)) == k for row in ids.tolist())
