"""Dynamic per-row FP8 quantization, the activations' half of an FP8 GEMM: each row of x becomes e4m3 with one
float32 scale, its absolute maximum (clipped to a bound, where a checkpoint sets one) mapped to e4m3's largest value.
row_scale and scaled_to_fp8 are that arithmetic for the kernels that quantize the rows they produce (the RMSNorm and
the MLP's gate); this kernel quantizes the others (attention's output).

One program per row, held whole in registers: its absolute maximum, then the row divided by the scale, clamped to
e4m3's range and stored, so x is read once. The torch composition of the same arithmetic (quantize_rows_fp8_ref)
reads x once per operator and writes four float32 copies of it: about 47 bytes of traffic per element against the
kernel's 3 (read 2, write 1).
The row's maximum is scaled by the reciprocal of e4m3's largest value and x is divided by the scale rounding to
nearest, as torch's CUDA operators do, so the results agree bit for bit. Asked for more rows than x has, it writes
the rows beyond as zeros with the smallest scale (a GEMM padded to a row count its library runs faster).
quantize_row_groups_fp8 quantizes each row's groups of columns this way, for GEMMs of block-wise FP8 weights.
"""
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
MIN_SCALE = 1e-12  # an all-zero row gets this scale instead of zero
_FP8_MAX = tl.constexpr(FP8_MAX)
_INV_FP8_MAX = tl.constexpr(1.0 / FP8_MAX)  # torch divides a tensor by a number as a product with its reciprocal


@triton.jit
def row_scale(absmax, absmax_bound, min_scale):
    """A row's scale: its absolute maximum, clipped to absmax_bound, maps to e4m3's largest value."""
    return tl.maximum(tl.minimum(absmax, absmax_bound) * _INV_FP8_MAX, min_scale)


@triton.jit
def scaled_to_fp8(x, scale, out_ptr):
    """x (float32) / scale in the e4m3 type of out_ptr, saturated to e4m3's range."""
    return tl.clamp(tl.math.div_rn(x, scale), -_FP8_MAX, _FP8_MAX).to(out_ptr.dtype.element_ty)


@triton.jit
def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, rows, K, stride_x, stride_out, min_scale, absmax_bound,
                          BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * stride_x + ks, mask=ks < tl.where(row < rows, K, 0), other=0.0).to(tl.float32)
    scale = row_scale(tl.max(tl.abs(x), 0), absmax_bound, min_scale)
    tl.store(scale_ptr + row, scale)
    tl.store(out_ptr + row * stride_out + ks, scaled_to_fp8(x, scale, out_ptr), mask=ks < K)


def whole_row_warps(block: int, fewest: int = 4, most: int = 32) -> int:
    """Warps for a program that holds a row of `block` elements in registers: 16 a thread, within [fewest, most]."""
    # NOTE: H100, CUDA graphs, Llama-3.1-8B's rows, 4/8/16/32 warps: act_and_mul_fp8 (silu) over 14,336 columns is
    # fastest at 32 (400 rows 15.3 us against 19.9 at 4; 8,192 rows 229 against 319), quantize_rows_fp8 over 4,096 at
    # 8 (3.1 and 35.6 us). The two-pass kernels before them, which read a row again from the L2 cache: 20.0 and 355,
    # 3.7 and 40.0.
    return min(max(block // 512, fewest), most)


def quantize_rows_fp8(x: torch.Tensor, rows_out: int | None = None,
                      absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [rows, K], its last dimension contiguous -> (x_q: [rows_out, K] e4m3, scale: [rows_out] float32), with
    x ≈ x_q[:rows] * scale[:rows, None] and zeros after (rows_out: rows unless given, at least rows). With
    absmax_bound, a row's absolute maximum is clipped to it before the scale is taken: larger elements saturate."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [rows, K] with contiguous rows, got {tuple(x.shape)} strides {x.stride()}")
    rows, k = x.shape
    out, scale = empty_quantized_rows(rows, k, rows_out, x.device)
    rows_out = out.shape[0]
    if rows_out:
        block = triton.next_power_of_2(k)
        _quantize_rows_kernel[(rows_out,)](x, out, scale, rows, k, x.stride(0), out.stride(0), MIN_SCALE,
                                           bound_argument(absmax_bound), BLOCK_K=block,
                                           num_warps=whole_row_warps(block))
    return out, scale


def empty_quantized_rows(rows: int, k: int, rows_out: int | None,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty e4m3 rows [rows_out, k] and their float32 scales [rows_out], for `rows` rows of activations padded to
    rows_out (rows unless given; at least rows)."""
    rows_out = rows if rows_out is None else rows_out
    if rows_out < rows:
        raise ValueError(f"rows_out ({rows_out}) must be at least x's rows ({rows})")
    return (torch.empty(rows_out, k, dtype=FP8, device=device),
            torch.empty(rows_out, dtype=torch.float32, device=device))


def bound_argument(absmax_bound: float | None) -> float:
    """A kernel's absmax_bound argument: no bound is an infinite one, which clips nothing."""
    return math.inf if absmax_bound is None else absmax_bound


def quantize_rows_fp8_ref(x: torch.Tensor, rows_out: int | None = None,
                          absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x = x if rows_out is None else F.pad(x, (0, 0, 0, rows_out - x.shape[0]))
    absmax = x.float().abs().amax(dim=-1)
    scale = ((absmax if absmax_bound is None else absmax.clamp_max(absmax_bound)) / FP8_MAX).clamp_min(MIN_SCALE)
    return (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_row_groups_fp8(x: torch.Tensor, group: int,
                            absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [rows, K] -> (x_q: [rows, G * group] e4m3, scale: [rows, G] float32), G = ceil(K / group): each row's
    groups of `group` columns quantized as quantize_rows_fp8 quantizes a row (vLLM's per-token-group quantization
    for block-wise FP8 weights); the columns that complete the last group are zeros."""
    return _row_groups(x, group, quantize_rows_fp8, absmax_bound)


def quantize_row_groups_fp8_ref(x: torch.Tensor, group: int,
                                absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _row_groups(x, group, quantize_rows_fp8_ref, absmax_bound)


def _row_groups(x: torch.Tensor, group: int, quantize_rows, absmax_bound: float | None):
    rows, k = x.shape
    whole_groups = x if k % group == 0 else F.pad(x, (0, -k % group))
    x_q, scale = quantize_rows(whole_groups.reshape(-1, group), absmax_bound=absmax_bound)
    return x_q.view(rows, -1), scale.view(rows, -1)
