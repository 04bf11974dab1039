"""Gated activations of the MLP, act(gate) * up over the fused [gate | up] projection output: SiLU (Llama's SwiGLU) or
the tanh approximation of GELU (Gemma's GeGLU), in the input's dtype or quantized per row to e4m3 for the FP8 GEMM
that reads it (kernels.fp8_quant's arithmetic)."""
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sluice.kernels.fp8_quant import (MIN_SCALE, bound_argument, empty_quantized_rows, row_scale, scaled_to_fp8,
                                      whole_row_warps)

ACTIVATIONS = ("silu", "gelu_tanh")
_TWO_SQRT_2_OVER_PI = tl.constexpr(2 * math.sqrt(2 / math.pi))  # gelu_tanh: 2u = this * (g + 0.044715 g^3)


@triton.jit
def activate(g, ACTIVATION: tl.constexpr):
    """ACTIVATION(g) for fp32 g, both as g * sigmoid(z): silu's z = g; gelu_tanh's g / 2 * (1 + tanh(u)) with
    u = sqrt(2 / pi) * (g + 0.044715 g^3) is g * sigmoid(2u), which needs no tanh (the interpreter has none) and
    does not cancel where tanh(u) nears -1."""
    if ACTIVATION == "gelu_tanh":
        z = _TWO_SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
    else:
        z = g
    return g / (1.0 + tl.exp(-z))


@triton.jit
def _gated(x_row, cols, mask, D: tl.constexpr, ACTIVATION: tl.constexpr):
    """ACTIVATION(x_row[cols]) * x_row[D + cols], each rounded to the input dtype as the unfused model code rounds
    them, returned in float32 (0 where masked). The activation runs in fp32."""
    gate = tl.load(x_row + cols, mask=mask, other=0.0)
    up = tl.load(x_row + D + cols, mask=mask, other=0.0)
    act = activate(gate.to(tl.float32), ACTIVATION).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype).to(tl.float32)


@triton.jit
def _act_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, D: tl.constexpr, BLOCK: tl.constexpr,
                        ACTIVATION: tl.constexpr):
    """Program (row, chunk) computes out[row, c] = ACTIVATION(x[row, c]) * x[row, D + c] for BLOCK columns c."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    y = _gated(x_ptr + row * stride_x, cols, mask, D, ACTIVATION)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act_and_mul_fp8_kernel(x_ptr, out_ptr, scale_ptr, rows, stride_x, stride_o, min_scale, absmax_bound,
                            D: tl.constexpr, BLOCK: tl.constexpr, ACTIVATION: tl.constexpr):
    """Program `row` gates one row held whole in registers (BLOCK >= D) and stores it divided by its scale in e4m3.
    A padding row (row >= rows) reads nothing and stores zeros with the smallest scale."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    y = _gated(x_ptr + row * stride_x, cols, cols < tl.where(row < rows, D, 0), D, ACTIVATION)
    scale = row_scale(tl.max(tl.abs(y), 0), absmax_bound, min_scale)
    tl.store(scale_ptr + row, scale)
    tl.store(out_ptr + row * stride_o + cols, scaled_to_fp8(y, scale, out_ptr), mask=cols < D)


def check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} not in {ACTIVATIONS}")


def _gate_rows(x: torch.Tensor, activation: str) -> torch.Tensor:
    check_activation(activation)
    if x.shape[-1] % 2:
        raise ValueError(f"last dim {x.shape[-1]} is not even")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"dtype {x.dtype} not supported")
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


def act_and_mul(x: torch.Tensor, activation: str) -> torch.Tensor:
    """Returns a new [..., d] tensor activation(x[..., :d]) * x[..., d:] for x: [..., 2 * d], activation one of
    ACTIVATIONS."""
    rows = _gate_rows(x, activation)
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    if rows.shape[0] and d:
        # NOTE: a fixed 1024-column chunk keeps every program the same size whatever the intermediate size (not
        # swept; 4096 x 3072 runs 18.5 us on the H200 in a CUDA graph, 4.1 TB/s, benchmarks/kernel_timings.py).
        block = min(1024, triton.next_power_of_2(d))
        out_rows = out.view(-1, d)
        _act_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
            rows, out_rows, rows.stride(0), out_rows.stride(0), D=d, BLOCK=block, ACTIVATION=activation, num_warps=4,
        )
    return out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """act_and_mul(x, "silu"): the MLP gate of Llama and most families."""
    return act_and_mul(x, "silu")


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """act_and_mul(x, "gelu_tanh"): Gemma's GeGLU."""
    return act_and_mul(x, "gelu_tanh")


def act_and_mul_fp8(x: torch.Tensor, activation: str, rows_out: int | None = None,
                    absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """act_and_mul(x, activation) for x: [rows, 2 * d], quantized per row as kernels.fp8_quant.quantize_rows_fp8
    quantizes it (rows_out, absmax_bound alike), without the [rows, d] result in between: (x_q [rows_out, d] e4m3,
    scale [rows_out] float32)."""
    rows = _gate_rows(x, activation)
    d = x.shape[-1] // 2
    out, scale = empty_quantized_rows(rows.shape[0], d, rows_out, x.device)
    if out.shape[0] and d:
        block = triton.next_power_of_2(d)
        _act_and_mul_fp8_kernel[(out.shape[0],)](
            rows, out, scale, rows.shape[0], rows.stride(0), out.stride(0), MIN_SCALE, bound_argument(absmax_bound),
            D=d, BLOCK=block, ACTIVATION=activation, num_warps=whole_row_warps(block),
        )
    return out, scale


def act_and_mul_ref(x: torch.Tensor, activation: str) -> torch.Tensor:
    """Plain torch, as Hugging Face's LlamaMLP and GemmaMLP: act_fn(gate) * up in the input dtype (gelu_tanh:
    transformers' gelu_pytorch_tanh)."""
    check_activation(activation)
    gate, up = x.chunk(2, dim=-1)
    return (F.gelu(gate, approximate="tanh") if activation == "gelu_tanh" else F.silu(gate)) * up
