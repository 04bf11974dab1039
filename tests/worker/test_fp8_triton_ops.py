"""The Triton operators' FP8 layers of many rows: the norm before a projection and the MLP's gate quantize the
activations they produce themselves, which must be what the unfused kernels give the FP8 GEMM (Triton's interpreter
on the CPU, compiled on a GPU)."""
import dataclasses

import pytest
import torch

import kernels
from kernels.fp8_quant import quantize_rows_fp8
from worker_svc.models.fp8 import Fp8Linear, quantize_rows
from worker_svc.models.fp8_gemm import fp8_gemm_for, scaled_mm_rows
from worker_svc.models.triton_ops import TritonOps, UngatedRows

HIDDEN, INTERMEDIATE = 64, 96


def _fp8_layer(out_features: int, in_features: int, device: torch.device) -> Fp8Linear:
    layer = Fp8Linear(in_features, out_features).to(device)
    layer.weight.data, layer.weight_scale.data = quantize_rows(torch.randn(out_features, in_features,
                                                                           device=device) / in_features**0.5)
    return layer


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("rows", [3, 400])  # 400 rows run padded to 512 where the GEMM pads
@pytest.mark.parametrize("absmax_bound", [None, 0.25])
def test_mlp_rows_are_what_the_unfused_kernels_give_the_fp8_gemm(device, rows, absmax_bound):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gemm = dataclasses.replace(fp8_gemm_for(device, quantize_rows_fp8, absmax_bound), padded_rows=scaled_mm_rows)
    ops = TritonOps(gemm)
    gate_up, down = _fp8_layer(2 * INTERMEDIATE, HIDDEN, device), _fp8_layer(HIDDEN, INTERMEDIATE, device)
    x, residual = torch.randn(2, rows, HIDDEN, device=device, dtype=dtype)
    norm_weight = torch.randn(HIDDEN, device=device, dtype=dtype)

    gated, new_residual = ops.norm_linear(x, residual, norm_weight, 1e-6, gate_up, gated=True)
    assert isinstance(gated, UngatedRows)
    out = ops.linear(gated, down)

    normed, expected_residual = kernels.fused_add_rms_norm(x, residual, norm_weight, 1e-6)
    expected = gemm(kernels.silu_and_mul(gemm(normed, gate_up.weight, gate_up.weight_scale, None)), down.weight,
                    down.weight_scale, None)
    assert torch.equal(new_residual, expected_residual)
    assert out.dtype == dtype and torch.equal(out, expected)


def test_an_unquantized_projection_reads_the_gate_unquantized(device):
    """A down projection on a checkpoint's ignore list (nn.Linear) after an FP8 gate_up reads silu(gate) * up as
    it is."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ops = TritonOps(fp8_gemm_for(device, quantize_rows_fp8))
    gate_up = _fp8_layer(2 * INTERMEDIATE, HIDDEN, device)
    down = torch.nn.Linear(INTERMEDIATE, HIDDEN, device=device, dtype=dtype)
    x = torch.randn(5, HIDDEN, device=device, dtype=dtype)
    gated, _ = ops.norm_linear(x, None, torch.ones(HIDDEN, device=device, dtype=dtype), 1e-6, gate_up, gated=True)
    with torch.no_grad():
        assert torch.equal(ops.linear(gated, down), down(kernels.silu_and_mul(gated.gate_up)))
