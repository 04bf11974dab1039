"""RMSNorm, alone or fused with the residual add that precedes it in every decoder layer; its output in the input's
dtype, or quantized per row to e4m3 for the FP8 GEMM that reads it (kernels.fp8_quant's arithmetic). Llama's norm
(rmsnorm(x) rounded, then times weight) or Gemma's (rmsnorm(x) * (1 + weight) in fp32, rounded once)."""
import torch
import triton
import triton.language as tl

from sluice.kernels.fp8_quant import (MIN_SCALE, bound_argument, empty_quantized_rows, row_scale, scaled_to_fp8,
                                      whole_row_warps)

NORM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def apply_norm_weight(normed, w, dtype: tl.constexpr, GEMMA_NORM: tl.constexpr):
    """The fp32 normalised values times their fp32 norm weights, in dtype: Llama's rounding to dtype before and after
    the multiply, or with GEMMA_NORM Gemma's normed * (1 + w), rounded once."""
    if GEMMA_NORM:
        return (normed * (1.0 + w)).to(dtype)
    return (normed.to(dtype).to(tl.float32) * w).to(dtype)


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, scale_ptr,
    rows, stride_x, stride_r, stride_o, stride_ro,
    eps, min_scale, absmax_bound,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, QUANTIZE: tl.constexpr,
    GEMMA_NORM: tl.constexpr,
):
    """Program `row` normalises one row of `hidden` values held whole in registers (BLOCK >= hidden).

    With HAS_RESIDUAL it first forms h = x + residual, rounds it to the input dtype and stores it as the new
    residual; the norm then reads that rounded h, as the unfused model code would. The mean of squares and the
    scaling run in fp32; like Hugging Face's LlamaRMSNorm, the normalised row is rounded to the input dtype before
    the weight multiply, and the product is rounded again. With GEMMA_NORM, like GemmaRMSNorm, the normalised row is
    multiplied by 1 + weight in fp32 and rounded once. With QUANTIZE that row is stored divided by its scale in
    e4m3, the scale at scale_ptr; a padding row (row >= rows) reads nothing and stores zeros with the smallest scale.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    present = cols < tl.where(row < rows, HIDDEN, 0)
    x = tl.load(x_ptr + row * stride_x + cols, mask=present, other=0.0)
    dtype = x.dtype

    # -- optional residual add, rounded to the input dtype
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=present, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(dtype)
        tl.store(residual_out_ptr + row * stride_ro + cols, x, mask=present)

    # -- normalise in fp32
    h = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(h * h, 0) / HIDDEN + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = apply_norm_weight(h * inv_rms, w, dtype, GEMMA_NORM)
    if QUANTIZE:
        y = y.to(tl.float32)
        scale = row_scale(tl.max(tl.abs(y), 0), absmax_bound, min_scale)
        tl.store(scale_ptr + row, scale)
        tl.store(out_ptr + row * stride_o + cols, scaled_to_fp8(y, scale, out_ptr), mask=mask)
    else:
        tl.store(out_ptr + row * stride_o + cols, y, mask=mask)


def _as_rows(t: torch.Tensor, hidden: int) -> torch.Tensor:
    rows = t.reshape(-1, hidden)  # a view when the leading dims allow it, else a copy
    return rows if rows.stride(1) == 1 else rows.contiguous()


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, gemma_norm: bool,
            fp8: bool = False, rows_out: int | None = None, absmax_bound: float | None = None):
    """(out, new_residual, scale): out in x's shape and dtype, or with fp8 e4m3 rows [rows_out, hidden] and their
    scales; new_residual None without a residual, scale None without fp8."""
    hidden = x.shape[-1]
    if x.dtype not in NORM_DTYPES:
        raise TypeError(f"x dtype {x.dtype} not in {NORM_DTYPES}")
    if weight.shape != (hidden,) or not weight.is_contiguous():
        raise ValueError(f"weight must be contiguous [{hidden}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"residual {residual.dtype} {tuple(residual.shape)} does not match x {x.dtype} "
                         f"{tuple(x.shape)}")
    x_rows = _as_rows(x, hidden)
    num_rows = x_rows.shape[0]
    scale = None
    if fp8:
        out_rows, scale = empty_quantized_rows(num_rows, hidden, rows_out, x.device)
        out = out_rows
    else:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        out_rows = out.view(-1, hidden)
    r_rows, r_out_rows = x_rows, x_rows  # placeholders, never touched without a residual
    new_residual = None
    if residual is not None:
        r_rows = _as_rows(residual, hidden)
        new_residual = torch.empty_like(x, memory_format=torch.contiguous_format)
        r_out_rows = new_residual.view(-1, hidden)
    if out_rows.shape[0]:
        block = triton.next_power_of_2(hidden)
        # NOTE: 1 to 16 warps (not swept; at hidden 1024 x 4096 tokens on the H200 the fused kernel runs 5.9 us in a
        # CUDA graph, benchmarks/kernel_timings.py).
        num_warps = whole_row_warps(block, fewest=1, most=16)
        _rms_norm_kernel[(out_rows.shape[0],)](
            x_rows, r_rows, weight, out_rows, r_out_rows, out_rows if scale is None else scale,
            num_rows, x_rows.stride(0), r_rows.stride(0), out_rows.stride(0), r_out_rows.stride(0),
            eps, MIN_SCALE, bound_argument(absmax_bound),
            HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None, QUANTIZE=fp8, GEMMA_NORM=gemma_norm,
            num_warps=num_warps,
        )
    return out, new_residual, scale


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False) -> torch.Tensor:
    """Returns a new tensor rmsnorm(x) * weight over the last dim, in x's dtype; x: [..., hidden]. gemma_norm:
    Gemma's rmsnorm(x) * (1 + weight) instead, rounded once."""
    return _launch(x, None, weight, eps, gemma_norm)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns new tensors (rms_norm(x + residual, weight, eps, gemma_norm), x + residual); x and residual are left
    untouched."""
    return _launch(x, residual, weight, eps, gemma_norm)[:2]


def rms_norm_fp8(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float, rows_out: int | None = None,
    absmax_bound: float | None = None, gemma_norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(x_q, scale, new_residual) for x: [rows, hidden]: rms_norm(x + residual, weight, eps, gemma_norm) (x alone
    with residual None, and new_residual None) quantized per row as kernels.fp8_quant.quantize_rows_fp8 quantizes it
    (rows_out, absmax_bound alike), without the normalised rows in between."""
    out, new_residual, scale = _launch(x, residual, weight, eps, gemma_norm, fp8=True, rows_out=rows_out,
                                       absmax_bound=absmax_bound)
    return out, scale, new_residual


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False) -> torch.Tensor:
    """Hugging Face LlamaRMSNorm: fp32 statistics, round to x's dtype, then multiply by the weight; with gemma_norm
    GemmaRMSNorm: fp32 statistics times 1 + weight in fp32, rounded once."""
    h = x.float()
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if gemma_norm:
        return (normed * (1.0 + weight.float())).to(x.dtype)
    return (weight.float() * normed.to(x.dtype).float()).to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused model code: residual add in x's dtype, then rms_norm_ref."""
    new_residual = x + residual
    return rms_norm_ref(new_residual, weight, eps, gemma_norm), new_residual
