import pytest
import torch

from sluice.kernels import fused_linear, fused_linear_ref

# bf16: up to four roundings (residual, norm, product, gate), each a truncation under the CPU interpreter
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=8e-2, rtol=4e-2)}
VARIANTS = {  # what is fused around the product: (norm, residual, bias, gated, gemma: Gemma's norm and GeGLU)
    "plain": (False, False, False, False, False),
    "bias": (False, False, True, False, False),
    "norm": (True, False, False, False, False),
    "add_norm": (True, True, False, False, False),
    "add_norm_bias": (True, True, True, False, False),
    "add_norm_gated": (True, True, False, True, False),
    "gemma_norm": (True, False, False, False, True),
    "gemma_add_norm": (True, True, False, False, True),
    "gemma_add_norm_gated": (True, True, False, True, True),
}


def _inputs(device, dtype, n, k, variant):
    norm, residual, bias, gated, gemma = VARIANTS[variant]
    x = torch.randn(1, k, device=device).to(dtype)
    weight = (torch.randn(2 * n if gated else n, k, device=device) / k**0.5).to(dtype)
    return x, weight, dict(
        bias=torch.randn(n, device=device).to(dtype) if bias else None,
        norm_weight=((0 if gemma else 1) + 0.1 * torch.randn(k, device=device)).to(dtype) if norm else None,
        eps=1e-6,
        residual=torch.randn(1, k, device=device).to(dtype) if residual else None,
        gated=gated, gemma_norm=gemma, activation="gelu_tanh" if gemma else "silu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(200, 576), (1000, 64), (5, 123), (37, 360)])  # 360: slices masked at K
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_matches_unfused_reference(device, dtype, n, k, variant):
    x, weight, options = _inputs(device, dtype, n, k, variant)
    out, new_residual = fused_linear(x, weight, **options)
    expected, expected_residual = fused_linear_ref(x, weight, **options)
    assert out.shape == expected.shape and out.dtype == dtype
    torch.testing.assert_close(out, expected, **TOL[dtype])
    if options["residual"] is None:
        assert new_residual is None
    else:
        torch.testing.assert_close(new_residual, expected_residual, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["plain", "add_norm_bias", "add_norm_gated", "gemma_add_norm_gated"])
def test_fp8_weights_match_the_reference(device, dtype, variant):
    """e4m3 weights with one scale per row (gate and up rows scaled apart), streamed as stored."""
    x, weight, options = _inputs(device, dtype, 200, 576, variant)
    weight_scale = weight.float().abs().amax(-1) / 448 * torch.linspace(0.5, 2, weight.shape[0], device=device)
    weight = (weight.float() / weight_scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    out, _ = fused_linear(x, weight, **options, weight_scale=weight_scale)
    torch.testing.assert_close(out, fused_linear_ref(x, weight, **options, weight_scale=weight_scale)[0],
                               **TOL[dtype])


def test_fp8_weights_need_their_scale(device):
    with pytest.raises(ValueError, match="does not fit"):
        fused_linear(torch.randn(1, 64, device=device), torch.randn(32, 64, device=device).to(torch.float8_e4m3fn))


@pytest.mark.parametrize("variant", ["add_norm", "gemma_add_norm"])
def test_float32_logits_from_bf16(device, variant):
    x, weight, options = _inputs(device, torch.bfloat16, 1000, 256, variant)
    out, _ = fused_linear(x, weight, **options, out_dtype=torch.float32)
    expected, _ = fused_linear_ref(x, weight, **options, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, **TOL[torch.bfloat16])


def test_inputs_left_untouched(device):
    x, weight, options = _inputs(device, torch.float32, 64, 128, "add_norm_gated")
    before = x.clone(), options["residual"].clone()
    fused_linear(x, weight, **options)
    assert torch.equal(x, before[0]) and torch.equal(options["residual"], before[1])


def test_rejects_more_than_one_row(device):
    x = torch.randn(2, 64, device=device)
    with pytest.raises(ValueError, match="one row"):
        fused_linear(x, torch.randn(32, 64, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,variant", [(4096, 1024, "add_norm"), (1024, 2048, "plain"),
                                         (3072, 1024, "add_norm_gated"), (14336, 4096, "add_norm_gated"),
                                         (4096, 14336, "plain"), (151936, 1024, "add_norm"),
                                         (10240, 2560, "gemma_add_norm_gated"), (262144, 2560, "gemma_add_norm"),
                                         (5120, 2880, "add_norm_bias"), (201088, 2880, "add_norm")])  # gpt-oss
def test_realistic(device, n, k, variant):
    x, weight, options = _inputs(device, torch.bfloat16, n, k, variant)
    out, _ = fused_linear(x, weight, **options)
    torch.testing.assert_close(out, fused_linear_ref(x, weight, **options)[0], **TOL[torch.bfloat16])
