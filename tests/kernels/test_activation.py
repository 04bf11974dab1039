import pytest
import torch

from kernels import silu_and_mul, silu_and_mul_ref

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
