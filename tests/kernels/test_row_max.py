import pytest
import torch

from sluice.kernels.row_max import row_max, row_max_ref


@pytest.mark.parametrize("n", [1, 1000, 1024, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_largest_and_its_first_index_as_torch_finds_them(device, n, dtype):
    x = torch.randn(6, n).to(dtype)
    x[1] = float("-inf")  # a row masked whole: index 0
    x[2, : n // 2] = float("-inf")
    x[3] = x[3].round()  # many ties; the first of the largest wins
    x[4, -1] = 100.0  # the largest in the last, partial chunk
    x[5] = 7.0  # all tied
    values, indices = row_max(x.to(device))
    expected_values, expected_indices = row_max_ref(x)
    assert torch.equal(values.cpu(), expected_values)
    assert torch.equal(indices.cpu(), expected_indices)
    assert values.dtype == dtype and indices.dtype == torch.int64


def test_rows_of_a_wider_buffer(device):
    buffer = torch.randn(8, 3000)
    buffer[:, 2500:] = 1000.0  # past the rows' columns: never read
    x = buffer[:5, :2500]
    values, indices = row_max(x.to(device))
    assert torch.equal(indices.cpu(), x.argmax(dim=-1))
    assert torch.equal(values.cpu(), x.amax(dim=-1))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 256])
def test_vocabulary_wide_rows(rows):
    x = torch.randn(rows, 128256, device="cuda") * 4
    values, indices = row_max(x)
    expected_values, expected_indices = row_max_ref(x)
    assert torch.equal(values, expected_values) and torch.equal(indices, expected_indices)
