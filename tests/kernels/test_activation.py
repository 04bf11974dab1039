import pytest
import torch

from sluice.kernels import act_and_mul, act_and_mul_fp8, act_and_mul_ref, gelu_tanh_and_mul, silu_and_mul
from sluice.kernels.fp8_quant import MIN_SCALE, quantize_rows_fp8

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}  # two bf16 roundings
ACTIVATIONS = ["silu", "gelu_tanh"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 123])
@pytest.mark.parametrize("d", [64, 1000, 2500])
def test_act_and_mul(device, dtype, num_tokens, d, activation):
    x = (3 * torch.randn(num_tokens, 2 * d, device=device)).to(dtype)
    out = act_and_mul(x, activation)
    assert out.shape == (num_tokens, d) and out.dtype == dtype
    torch.testing.assert_close(out, act_and_mul_ref(x, activation), **TOL[dtype])


def test_named_activations(device):
    x = torch.randn(5, 2 * 123, device=device)
    assert torch.equal(silu_and_mul(x), act_and_mul(x, "silu"))
    assert torch.equal(gelu_tanh_and_mul(x), act_and_mul(x, "gelu_tanh"))


def test_gelu_tanh_over_its_whole_range(device):
    """gelu_tanh as g * sigmoid(2u) is tanh's form without cancellation: within float32 rounding of transformers'
    gelu_pytorch_tanh from where it underflows to where it is the identity, and never NaN."""
    gate = torch.cat([torch.linspace(-30, 30, 6001), torch.tensor([-1e30, -1e4, 1e4, 1e30])]).to(device)
    x = torch.cat([gate, torch.ones_like(gate)])[None]
    torch.testing.assert_close(gelu_tanh_and_mul(x), act_and_mul_ref(x, "gelu_tanh"), atol=1e-6, rtol=1e-5)


def test_matches_transformers_gelu_pytorch_tanh(device):
    activations = pytest.importorskip("transformers.activations")
    x = (3 * torch.randn(7, 2 * 123, device=device)).to(torch.bfloat16)
    gate, up = x.chunk(2, dim=-1)
    expected = activations.ACT2FN["gelu_pytorch_tanh"](gate) * up
    assert torch.equal(act_and_mul_ref(x, "gelu_tanh"), expected)
    torch.testing.assert_close(gelu_tanh_and_mul(x), expected, **TOL[torch.bfloat16])


def test_leading_dims(device):
    x = torch.randn(2, 3, 128, device=device)
    torch.testing.assert_close(silu_and_mul(x), act_and_mul_ref(x, "silu"))


def test_rejects_an_unknown_activation(device):
    with pytest.raises(ValueError, match="relu"):
        act_and_mul(torch.randn(2, 8, device=device), "relu")


@pytest.mark.gpu
@pytest.mark.parametrize("activation, d", [("silu", 11008), ("gelu_tanh", 10240)])
def test_realistic(device, activation, d):
    x = torch.randn(4096, 2 * d, device=device).to(torch.bfloat16)
    torch.testing.assert_close(act_and_mul(x, activation), act_and_mul_ref(x, activation), **TOL[torch.bfloat16])


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_out, absmax_bound", [(None, None), (9, None), (6, 1.0)])
def test_fp8_output_is_the_gate_then_the_row_quantization(device, dtype, rows_out, absmax_bound, activation):
    """Bit for bit what act_and_mul's output gives quantize_rows_fp8, padding rows and the bound alike; d is no
    power of two, so the kernel masks the end of the row it holds."""
    x = (torch.randn(6, 2 * 2500, device=device) * 3).to(dtype)
    x_q, scale = act_and_mul_fp8(x, activation, rows_out, absmax_bound)
    expected_q, expected_scale = quantize_rows_fp8(act_and_mul(x, activation), rows_out, absmax_bound)
    assert x_q.shape == (rows_out or 6, 2500) and torch.equal(scale, expected_scale)
    assert torch.equal(x_q.float(), expected_q.float())
    assert not x_q[6:].float().any() and (scale[6:] == MIN_SCALE).all()
