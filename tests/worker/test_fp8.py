"""The FP8 linear layer's arithmetic: quantization, the emulated GEMM, and torch._scaled_mm (the GPU's call)."""
import pytest
import torch
import torch.nn.functional as F

from sluice.worker.ops.fp8 import FP8, dequantize_rows, quantize_linear_weights, quantize_rows
from sluice.worker.ops.fp8_gemm import emulated_fp8_linear, fp8_gemm_for, scaled_mm_fp8_linear, scaled_mm_rows


@pytest.fixture
def layer():
    torch.manual_seed(0)
    x = torch.randn(7, 256) * torch.logspace(-2, 1, 7)[:, None]  # tokens of very different magnitudes
    weight = torch.randn(96, 256) / 16 * torch.logspace(-1, 1, 96)[:, None]
    return x, weight, torch.randn(96)


def test_each_row_is_scaled_to_the_e4m3_range(layer):
    x, _, _ = layer
    x_q, scale = quantize_rows(x)
    assert x_q.dtype == FP8 and scale.shape == (7,)
    assert torch.equal(x_q.float().abs().amax(-1), torch.full((7,), 448.0))
    # e4m3 keeps 3 mantissa bits: within half an ulp, 1/16 of the value, above the subnormals
    error = (dequantize_rows(x_q, scale, torch.float32) - x).abs()
    assert (error <= x.abs() / 16 + scale[:, None] * 2**-9).all()


def test_an_absmax_bound_caps_the_scales_and_saturates_what_lies_beyond(layer):
    x, _, _ = layer
    bound = x[3].abs().max().item() / 2  # tokens 0-2 lie below it, 4-6 above
    x_q, scale = quantize_rows(x, absmax_bound=bound)
    unbounded_q, unbounded_scale = quantize_rows(x)
    above = x.abs().amax(-1) > bound
    assert above.tolist() == [False] * 3 + [True] * 4
    assert torch.equal(scale[~above], unbounded_scale[~above]) and torch.equal(x_q[~above].float(),
                                                                                unbounded_q[~above].float())
    assert torch.allclose(scale[above], torch.tensor(bound / 448.0))
    beyond = x[above].abs() >= bound
    assert beyond.any() and torch.equal(x_q[above].float()[beyond], 448.0 * x[above][beyond].sign())
    torch.testing.assert_close(fp8_gemm_for(x.device, absmax_bound=bound)(x, *quantize_rows(torch.eye(256)), None),
                               dequantize_rows(x_q, scale, torch.float32), rtol=1e-6, atol=0)


def test_zero_rows_quantize_to_zero():
    x_q, scale = quantize_rows(torch.zeros(2, 32))
    assert torch.equal(x_q.float(), torch.zeros(2, 32)) and (scale > 0).all()


def test_emulated_gemm_is_the_product_of_the_dequantized_operands(layer):
    x, weight, bias = layer
    w_q, w_scale = quantize_rows(weight)
    x_q, x_scale = quantize_rows(x)
    expected = F.linear(dequantize_rows(x_q, x_scale, torch.float64), dequantize_rows(w_q, w_scale, torch.float64),
                        bias.double())
    got = emulated_fp8_linear(x, w_q, w_scale, bias)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-4, rtol=1e-4)
    # and it stays near the unquantized layer: each token's output within a few percent of its norm
    exact = F.linear(x, weight, bias) - bias
    assert ((got - bias - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.06


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_scaled_mm_matches_the_emulation(layer, dtype, device):
    """torch._scaled_mm (what a GPU with FP8 runs, with fast accumulation; the CPU has an implementation too): the
    call's layouts and scales agree with the emulated arithmetic, up to its bf16 output."""
    x, weight, bias = (tensor.to(device) for tensor in layer)
    w_q, w_scale = quantize_rows(weight)
    x, bias = x.to(dtype), bias.to(dtype)
    got = scaled_mm_fp8_linear(x, w_q, w_scale, bias)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), emulated_fp8_linear(x, w_q, w_scale, bias).float(), atol=3e-2,
                               rtol=1.6e-2)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_gemm_padded_for_cublas_returns_its_own_rows(device):
    torch.manual_seed(1)
    x, weight = torch.randn(400, 64, device=device), torch.randn(32, 64, device=device)
    w_q, w_scale = quantize_rows(weight)
    assert [scaled_mm_rows(rows) for rows in (1, 300, 384, 400, 512, 656, 1000, 1100)] == \
        [1, 300, 384, 512, 512, 768, 1024, 1100]
    got = scaled_mm_fp8_linear(x, w_q, w_scale, None)
    assert got.shape == (400, 32)
    # each row's product is the one a GEMM without padding gives, up to its bf16 output (a GPU may pick other kernels)
    unpadded = torch.cat([scaled_mm_fp8_linear(rows, w_q, w_scale, None) for rows in x.split(200)])
    torch.testing.assert_close(got, unpadded, atol=3e-2, rtol=1.6e-2)


def test_the_cpu_emulates_and_other_devices_without_fp8_fail_at_start():
    assert fp8_gemm_for(torch.device("cpu")) == emulated_fp8_linear
    with pytest.raises(RuntimeError, match="quantization fp8 needs FP8 GEMMs"):
        fp8_gemm_for(torch.device("meta"))


def test_only_decoder_projections_are_quantized():
    state = {"layers.0.self_attn.qkv_proj.weight": torch.randn(48, 16), "layers.0.self_attn.qkv_proj.bias":
             torch.randn(48), "layers.0.mlp.down_proj.weight": torch.randn(16, 32),
             "layers.0.input_layernorm.weight": torch.ones(16), "lm_head.weight": torch.randn(100, 16),
             "embed_tokens.weight": torch.randn(100, 16)}
    given = dict(state)
    quantized = quantize_linear_weights(state)
    for name, rows in (("layers.0.self_attn.qkv_proj", 48), ("layers.0.mlp.down_proj", 16)):
        assert quantized[f"{name}.weight"].dtype == FP8
        assert quantized[f"{name}.weight_scale"].shape == (rows,)
    untouched = ["layers.0.self_attn.qkv_proj.bias", "layers.0.input_layernorm.weight", "lm_head.weight",
                 "embed_tokens.weight"]
    assert all(quantized[name] is given[name] for name in untouched)
    assert len(quantized) == len(given) + 2
