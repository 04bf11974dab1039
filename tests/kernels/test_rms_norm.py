import pytest
import torch

from sluice.kernels import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_fp8, rms_norm_ref
from sluice.kernels.fp8_quant import MIN_SCALE, quantize_rows_fp8

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _norm_weight(hidden: int, gemma_norm: bool, device, dtype) -> torch.Tensor:
    """Weights near 1, or for Gemma's norm (which multiplies by 1 + weight) near 0."""
    return ((0 if gemma_norm else 1) + 0.1 * torch.randn(hidden, device=device)).to(dtype)


@pytest.mark.parametrize("gemma_norm", [False, True], ids=["llama_norm", "gemma_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 123])
@pytest.mark.parametrize("hidden", [64, 1000])
def test_rms_norm(device, dtype, num_tokens, hidden, gemma_norm):
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    weight = _norm_weight(hidden, gemma_norm, device, dtype)
    out = rms_norm(x, weight, 1e-6, gemma_norm)
    assert out.dtype == dtype
    torch.testing.assert_close(out, rms_norm_ref(x, weight, 1e-6, gemma_norm), **TOL[dtype])


@pytest.mark.parametrize("gemma_norm", [False, True], ids=["llama_norm", "gemma_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 123])
@pytest.mark.parametrize("hidden", [64, 1000])
def test_fused_add_rms_norm(device, dtype, num_tokens, hidden, gemma_norm):
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    residual = torch.randn(num_tokens, hidden, device=device).to(dtype)
    weight = _norm_weight(hidden, gemma_norm, device, dtype)
    x_before, residual_before = x.clone(), residual.clone()
    normed, new_residual = fused_add_rms_norm(x, residual, weight, 1e-5, gemma_norm)
    ref_normed, ref_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-5, gemma_norm)
    # NOTE: the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest even, so exact equality of the
    # rounded add is checked on CUDA only (test_realistic)
    torch.testing.assert_close(new_residual, ref_residual, **TOL[dtype])
    torch.testing.assert_close(normed, ref_normed, **TOL[dtype])
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # inputs untouched


def test_leading_dims_and_strided_rows(device):
    x = torch.randn(3, 4, 96, device=device)[:, ::2]  # [3, 2, 96], rows not evenly strided
    weight = torch.randn(96, device=device)
    torch.testing.assert_close(rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6))


def test_matches_transformers_llama_rms_norm(device):
    transformers = pytest.importorskip("transformers.models.llama.modeling_llama")
    norm = transformers.LlamaRMSNorm(128, eps=1e-5).to(device=device, dtype=torch.bfloat16)
    torch.nn.init.normal_(norm.weight, mean=1.0, std=0.1)
    x = torch.randn(7, 128, device=device).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(rms_norm_ref(x, norm.weight, 1e-5), norm(x))
        torch.testing.assert_close(rms_norm(x, norm.weight, 1e-5), norm(x), **TOL[torch.bfloat16])


@pytest.mark.parametrize("module", ["gemma2", "gemma3"])
def test_matches_transformers_gemma_rms_norm(device, module):
    transformers = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    norm = getattr(transformers, f"{module.capitalize()}RMSNorm")(123, eps=1e-6).to(device=device, dtype=torch.bfloat16)
    torch.nn.init.normal_(norm.weight, mean=0.0, std=0.1)
    x = torch.randn(7, 123, device=device).to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(rms_norm_ref(x, norm.weight, 1e-6, gemma_norm=True), norm(x))
        torch.testing.assert_close(rms_norm(x, norm.weight, 1e-6, gemma_norm=True), norm(x), **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("gemma_norm", [False, True], ids=["llama_norm", "gemma_norm"])
@pytest.mark.parametrize("hidden", [1024, 2560, 4096, 8192])
def test_realistic(device, hidden, gemma_norm):
    x, residual = torch.randn(2, 4096, hidden, device=device).to(torch.bfloat16)
    weight = torch.randn(hidden, device=device).to(torch.bfloat16)
    normed, new_residual = fused_add_rms_norm(x, residual, weight, 1e-6, gemma_norm)
    ref_normed, ref_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-6, gemma_norm)
    assert torch.equal(new_residual, ref_residual)
    torch.testing.assert_close(normed, ref_normed, **TOL[torch.bfloat16])


@pytest.mark.parametrize("gemma_norm", [False, True], ids=["llama_norm", "gemma_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("rows_out, absmax_bound", [(None, None), (8, None), (5, 0.5)])
def test_fp8_output_is_the_norm_then_the_row_quantization(device, dtype, with_residual, rows_out, absmax_bound,
                                                          gemma_norm):
    """Bit for bit what the norm kernel's output gives quantize_rows_fp8, padding rows and the bound alike."""
    x, residual = (torch.randn(2, 5, 1000, device=device) * 4).to(dtype)
    weight = torch.randn(1000, device=device).to(dtype)
    x_q, scale, new_residual = rms_norm_fp8(x, residual if with_residual else None, weight, 1e-6, rows_out,
                                            absmax_bound, gemma_norm)
    if with_residual:
        normed, expected_residual = fused_add_rms_norm(x, residual, weight, 1e-6, gemma_norm)
        assert torch.equal(new_residual, expected_residual)
    else:
        normed = rms_norm(x, weight, 1e-6, gemma_norm)
        assert new_residual is None
    expected_q, expected_scale = quantize_rows_fp8(normed, rows_out, absmax_bound)
    assert x_q.shape == (rows_out or 5, 1000) and torch.equal(scale, expected_scale)
    assert torch.equal(x_q.float(), expected_q.float())
    assert not x_q[5:].float().any() and (scale[5:] == MIN_SCALE).all()
