import pytest
import torch

from sluice.kernels.seeded_uniform import seeded_uniform, seeded_uniform_ref
from sluice.worker.sampling.seeded_random import seeded_uniform_torch

EDGE_SEEDS = [[0, 0], [2**32 - 1, 2**32 - 1], [12345, 678], [1, 2**31]]
EDGE_POSITIONS = [0, 2**31, 7, 2**32 + 5]


def _table(num_rows: int) -> torch.Tensor:
    """[rows, 5] int64 like SamplingRows' integer columns: seeds and output positions are strided views of it."""
    table = torch.randint(0, 2**32, (num_rows, 5), dtype=torch.int64)
    table[:, 2] = torch.randint(0, 2**20, (num_rows,))
    return table


@pytest.mark.parametrize("stream", [0, 0x9E3779B9])
def test_kernel_matches_python_integers_on_strided_rows(device, stream):
    table = _table(300)
    table[:4, 3:5] = torch.tensor(EDGE_SEEDS)
    table[:4, 2] = torch.tensor(EDGE_POSITIONS)
    seeds, positions = table[:, 3:5], table[:, 2]
    expected = seeded_uniform_ref(seeds, positions, stream)
    assert torch.equal(seeded_uniform(seeds.to(device), positions.to(device), stream).cpu(), expected)
    assert torch.equal(seeded_uniform_torch(seeds, positions, stream), expected)
    assert ((expected > 0) & (expected < 1)).all() and expected.unique().numel() == 300


def test_streams_and_positions_give_other_numbers(device):
    table = _table(64).to(device)
    seeds, positions = table[:, 3:5], table[:, 2]
    first = seeded_uniform(seeds, positions)
    assert not torch.isin(first, seeded_uniform(seeds, positions, 0x9E3779B9)).any()
    assert not torch.isin(first, seeded_uniform(seeds, positions + 1)).any()


def test_an_empty_batch(device):
    empty = torch.zeros(0, 2, dtype=torch.int64, device=device)
    assert seeded_uniform(empty, empty[:, 0]).shape == (0,)
