"""Gated activation of the Llama MLP: silu(gate) * up over the fused [gate | up] projection output, in the input's
dtype or quantized per row to e4m3 for the FP8 GEMM that reads it (kernels.fp8_quant's arithmetic)."""
import torch
import triton
import triton.language as tl

from sluice.kernels.fp8_quant import (MIN_SCALE, bound_argument, empty_quantized_rows, row_scale, scaled_to_fp8,
                                      whole_row_warps)


@triton.jit
def _gated(x_row, cols, mask, D: tl.constexpr):
    """silu(x_row[cols]) * x_row[D + cols], each rounded to the input dtype as the unfused model code rounds them,
    returned in float32 (0 where masked). silu runs in fp32."""
    gate = tl.load(x_row + cols, mask=mask, other=0.0)
    up = tl.load(x_row + D + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
    return (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype).to(tl.float32)


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, D: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, chunk) computes out[row, c] = silu(x[row, c]) * x[row, D + c] for BLOCK columns c."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    y = _gated(x_ptr + row * stride_x, cols, mask, D)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_fp8_kernel(x_ptr, out_ptr, scale_ptr, rows, stride_x, stride_o, min_scale, absmax_bound,
                             D: tl.constexpr, BLOCK: tl.constexpr):
    """Program `row` gates one row held whole in registers (BLOCK >= D) and stores it divided by its scale in e4m3.
    A padding row (row >= rows) reads nothing and stores zeros with the smallest scale."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    y = _gated(x_ptr + row * stride_x, cols, cols < tl.where(row < rows, D, 0), D)
    scale = row_scale(tl.max(tl.abs(y), 0), absmax_bound, min_scale)
    tl.store(scale_ptr + row, scale)
    tl.store(out_ptr + row * stride_o + cols, scaled_to_fp8(y, scale, out_ptr), mask=cols < D)


def _gate_rows(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2:
        raise ValueError(f"last dim {x.shape[-1]} is not even")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"dtype {x.dtype} not supported")
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Returns a new [..., d] tensor silu(x[..., :d]) * x[..., d:] for x: [..., 2 * d]."""
    rows = _gate_rows(x)
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
    if rows.shape[0] and d:
        # NOTE: a fixed 1024-column chunk keeps every program the same size whatever the intermediate size (not
        # swept; 4096 x 3072 runs 18.5 us on the H200 in a CUDA graph, 4.1 TB/s, benchmarks/kernel_timings.py).
        block = min(1024, triton.next_power_of_2(d))
        out_rows = out.view(-1, d)
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(d, block))](
            rows, out_rows, rows.stride(0), out_rows.stride(0), D=d, BLOCK=block, num_warps=4,
        )
    return out


def silu_and_mul_fp8(x: torch.Tensor, rows_out: int | None = None,
                     absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """silu_and_mul(x) for x: [rows, 2 * d], quantized per row as kernels.fp8_quant.quantize_rows_fp8 quantizes it
    (rows_out, absmax_bound alike), without the [rows, d] result in between: (x_q [rows_out, d] e4m3, scale
    [rows_out] float32)."""
    rows = _gate_rows(x)
    d = x.shape[-1] // 2
    out, scale = empty_quantized_rows(rows.shape[0], d, rows_out, x.device)
    if out.shape[0] and d:
        block = triton.next_power_of_2(d)
        _silu_and_mul_fp8_kernel[(out.shape[0],)](
            rows, out, scale, rows.shape[0], rows.stride(0), out.stride(0), MIN_SCALE, bound_argument(absmax_bound),
            D=d, BLOCK=block, num_warps=whole_row_warps(block),
        )
    return out, scale


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Plain torch, as Hugging Face's LlamaMLP: act_fn(gate) * up in the input dtype."""
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]
