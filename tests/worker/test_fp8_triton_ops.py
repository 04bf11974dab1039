"""The Triton operators' FP8 layers of many rows: on a GPU the norm before a projection and the MLP's gate quantize
the activations they produce themselves, which must be what the unfused kernels give the FP8 GEMM; on the CPU, where
Triton's interpreter rounds FP8 stores wrongly, the GEMM quantizes them with torch, as the torch operators do."""
import pytest
import torch

from sluice import kernels
from sluice.kernels.fp8_quant import quantize_rows_fp8
from sluice.worker.ops.fp8 import Fp8Linear, quantize_rows
from sluice.worker.ops.fp8_gemm import fp8_gemm_for
from sluice.worker.ops.triton_kernels import TritonOps, UngatedRows

HIDDEN, INTERMEDIATE = 64, 96


def _fp8_layer(out_features: int, in_features: int, device: torch.device) -> Fp8Linear:
    layer = Fp8Linear(in_features, out_features).to(device)
    layer.weight.data, layer.weight_scale.data = quantize_rows(torch.randn(out_features, in_features,
                                                                           device=device) / in_features**0.5)
    return layer


@pytest.fixture
def device() -> torch.device:
    """The Triton kernels compile for the GPU where there is one (then they cannot take CPU tensors), else they run
    in the interpreter."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])  # Gemma's norm and GeGLU
@pytest.mark.parametrize("rows", [3, 400])  # 400 rows run padded to 512 on a GPU
@pytest.mark.parametrize("absmax_bound", [None, 0.25])
def test_mlp_rows_are_what_the_unfused_kernels_give_the_fp8_gemm(device, rows, absmax_bound, gemma):
    torch.manual_seed(0)
    gemm = fp8_gemm_for(device, quantize_rows_fp8, absmax_bound)
    assert gemm.quantize is (quantize_rows_fp8 if device.type == "cuda" else quantize_rows)
    gate_up, down = _fp8_layer(2 * INTERMEDIATE, HIDDEN, device), _fp8_layer(HIDDEN, INTERMEDIATE, device)
    x, residual = torch.randn(2, rows, HIDDEN, device=device, dtype=_dtype(device))
    norm_weight = torch.randn(HIDDEN, device=device, dtype=_dtype(device))
    ops = TritonOps(gemm)
    activation = "gelu_tanh" if gemma else "silu"
    gated, new_residual = ops.norm_linear(x, residual, norm_weight, 1e-6, gate_up, gated=True, gemma_norm=gemma,
                                          activation=activation)
    assert isinstance(gated, UngatedRows) == (device.type == "cuda")
    out = ops.linear(gated, down)
    normed, expected_residual = kernels.fused_add_rms_norm(x, residual, norm_weight, 1e-6, gemma)
    expected = gemm(kernels.act_and_mul(gemm(normed, gate_up.weight, gate_up.weight_scale, None), activation),
                    down.weight, down.weight_scale, None)
    assert torch.equal(new_residual, expected_residual)
    assert out.dtype == x.dtype and torch.equal(out, expected)


def test_an_unquantized_projection_reads_the_gate_unquantized(device):
    """A down projection on a checkpoint's ignore list (nn.Linear) after an FP8 gate_up reads silu(gate) * up as
    it is."""
    ops = TritonOps(fp8_gemm_for(device, quantize_rows_fp8))
    gate_up = _fp8_layer(2 * INTERMEDIATE, HIDDEN, device)
    down = torch.nn.Linear(INTERMEDIATE, HIDDEN, device=device, dtype=_dtype(device))
    x = torch.randn(5, HIDDEN, device=device, dtype=_dtype(device))
    ones = torch.ones(HIDDEN, device=device, dtype=_dtype(device))
    gated, _ = ops.norm_linear(x, None, ones, 1e-6, gate_up, gated=True)
    with torch.no_grad():
        expected = down(kernels.silu_and_mul(ops.fp8_gemm(kernels.rms_norm(x, ones, 1e-6), gate_up.weight,
                                                          gate_up.weight_scale, None)))
        assert torch.equal(ops.linear(gated, down), expected)
