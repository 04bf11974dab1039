import pytest
import torch

from sluice.kernels import silu_and_mul, silu_and_mul_fp8, silu_and_mul_ref
from sluice.kernels.fp8_quant import MIN_SCALE, quantize_rows_fp8

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}  # two bf16 roundings


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 123])
@pytest.mark.parametrize("d", [64, 1000, 2500])
def test_silu_and_mul(device, dtype, num_tokens, d):
    x = (3 * torch.randn(num_tokens, 2 * d, device=device)).to(dtype)
    out = silu_and_mul(x)
    assert out.shape == (num_tokens, d) and out.dtype == dtype
    torch.testing.assert_close(out, silu_and_mul_ref(x), **TOL[dtype])


def test_leading_dims(device):
    x = torch.randn(2, 3, 128, device=device)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x))


@pytest.mark.gpu
def test_realistic(device):
    x = torch.randn(4096, 2 * 11008, device=device).to(torch.bfloat16)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_out, absmax_bound", [(None, None), (9, None), (6, 1.0)])
def test_fp8_output_is_the_gate_then_the_row_quantization(device, dtype, rows_out, absmax_bound):
    """Bit for bit what silu_and_mul's output gives quantize_rows_fp8, padding rows and the bound alike; d is no
    power of two, so the kernel masks the end of the row it holds."""
    x = (torch.randn(6, 2 * 2500, device=device) * 3).to(dtype)
    x_q, scale = silu_and_mul_fp8(x, rows_out, absmax_bound)
    expected_q, expected_scale = quantize_rows_fp8(silu_and_mul(x), rows_out, absmax_bound)
    assert x_q.shape == (rows_out or 6, 2500) and torch.equal(scale, expected_scale)
    assert torch.equal(x_q.float(), expected_q.float())
    assert not x_q[6:].float().any() and (scale[6:] == MIN_SCALE).all()
