import pytest
import torch

from sluice.kernels import decode_step_inputs, decode_step_inputs_ref
from sluice.worker.ops.plain_torch import TorchOps


def _inputs(device, num_rows: int, block_size: int, max_blocks: int = 7):
    next_positions = torch.randint(0, max_blocks * block_size, (num_rows,), device=device)
    live = torch.rand(num_rows, device=device) < 0.7
    next_positions[~live] = 10**6  # a padding row's stale position is never read
    block_tables = torch.randint(0, 1000, (num_rows, max_blocks), dtype=torch.int32, device=device)
    outputs = (torch.full((num_rows,), 5, dtype=torch.int64, device=device),
               torch.full((num_rows,), 5, dtype=torch.int64, device=device),
               torch.full((num_rows,), 5, dtype=torch.int32, device=device))
    return next_positions, live, block_tables, *outputs


@pytest.mark.parametrize("implementation", [decode_step_inputs, TorchOps.decode_step_inputs])
@pytest.mark.parametrize("num_rows", [1, 5, 123, 300])
@pytest.mark.parametrize("block_size", [16, 32])
def test_matches_ref(device, implementation, num_rows, block_size):
    actual = _inputs(device, num_rows, block_size)
    expected = tuple(t.clone() for t in actual)
    implementation(*actual, block_size)
    decode_step_inputs_ref(*expected, block_size)
    for name, a, e in zip(("next_positions", "live", "block_tables", "positions", "slot_mapping", "seq_lens"),
                          actual, expected):
        assert torch.equal(a, e), name


def test_live_rows_read_their_block_and_advance(device):
    next_positions = torch.tensor([0, 17, 40, 3], device=device)
    live = torch.tensor([True, True, False, True], device=device)
    block_tables = torch.tensor([[4, 9], [2, 6], [8, 8], [5, 1]], dtype=torch.int32, device=device)
    positions, slots = torch.empty(4, dtype=torch.int64, device=device), torch.empty(4, dtype=torch.int64,
                                                                                        device=device)
    seq_lens = torch.empty(4, dtype=torch.int32, device=device)
    decode_step_inputs(next_positions, live, block_tables, positions, slots, seq_lens, 16)
    assert positions.tolist() == [0, 17, 0, 3]
    assert slots.tolist() == [4 * 16, 6 * 16 + 1, -1, 5 * 16 + 3]
    assert seq_lens.tolist() == [1, 18, 1, 4]
    assert next_positions.tolist() == [1, 18, 40, 4]
