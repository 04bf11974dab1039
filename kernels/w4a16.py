"""W4A16 linear layers: y = x @ W.T (+ bias) for 4-bit weights in kernels.w4a16_layout's layout, dequantized in
registers, so no full-precision copy of a weight ever exists.

Two kernels, picked by the number of rows:
- the GEMM (prefill, batched decode): a program computes a BLOCK_M x BLOCK_N tile of y; per K slice it loads x's
  tile and the slice's packed words [BLOCK_K / 8, BLOCK_N], unpacks them into [BLOCK_K, BLOCK_N] values, subtracts
  the group's zero points, multiplies by its scales (one row of each: a slice lies in one group; with the layout's
  group_index, each row's own) and feeds tl.dot in the activation dtype, accumulating in float32.
- the decode kernel (a few rows): a program owns BLOCK_N output features of every row and streams their packed
  words once, in K slices; each word's eight values are summed against each row's inputs in float32 and scaled per
  word, without tensor cores, and the per-word sums are added over K after the loop, so the loop has no reduction
  across threads (the bound at batch 1 is the weights' bytes, not arithmetic). With group_index a word's eight rows
  may lie in different groups: each row is scaled by its own group's.
The GEMM rounds the dequantized weight to the activation dtype first, as the reference (dequantize, then F.linear)
does; the decode kernel does not round it, and agrees with the reference to the activation dtype's rounding.
"""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs
from sluice.kernels.fused_moe import _tile_of
from sluice.kernels.paged_kv import dot_config
from sluice.kernels.w4a16_layout import SYMMETRIC_ZERO, W4A16Weight, dequantize
from sluice.kernels.w4a16_tile import dequantized_tile, input_columns

DECODE_ROWS = 8  # at most this many rows take the decode kernel
_SYMMETRIC_ZERO = tl.constexpr(SYMMETRIC_ZERO)


@triton.jit
def _store(out_ptr, acc, bias_ptr, rows, row_mask, pid_n, N, stride_out, HAS_BIAS: tl.constexpr,
           BLOCK_N: tl.constexpr):
    out_cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + tl.minimum(out_cols, N - 1)).to(tl.float32)[None, :]
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_out + out_cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & (out_cols < N)[None, :])


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, perm_ptr, group_index_ptr, bias_ptr, out_ptr, M, N, K, stride_x,
    stride_out, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_GROUP_INDEX: tl.constexpr,
    HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    """Program (row tile, column tile) computes y[rows, cols] = x[rows] @ W.T[:, cols] (+ bias[cols]).

    K is a multiple of GROUP (the group, or K itself with HAS_GROUP_INDEX) and GROUP of BLOCK_K, so the K loop needs
    no masks; rows past M load zeros, columns past N are clamped to the last one and dropped at the store.
    """
    wait_for_inputs(PDL)
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        x_cols = input_columns(perm_ptr, k + tl.arange(0, BLOCK_K), HAS_PERM)
        a = tl.load(x_rows + x_cols[None, :], mask=row_mask[:, None], other=0.0)
        w = dequantized_tile(qweight_ptr + cols[None, :], scales_ptr + cols, zeros_ptr + cols, group_index_ptr, k, N,
                             N, HAS_ZEROS, HAS_GROUP_INDEX, GROUP, BLOCK_K, BLOCK_N)
        acc = tl.dot(a.to(DOT_DTYPE), w.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)
    _store(out_ptr, acc, bias_ptr, rows, row_mask, pid_n, N, stride_out, HAS_BIAS, BLOCK_N)


@triton.jit
def _group_scales(scales_ptr, zeros_ptr, groups, cols, N, HAS_ZEROS: tl.constexpr):
    """The scales and zero points (float32 [WORDS, BLOCK_N]) of groups [WORDS] for the columns cols."""
    scale = tl.load(scales_ptr + groups[:, None] * N + cols[None, :]).to(tl.float32)
    if HAS_ZEROS:
        zero = tl.load(zeros_ptr + groups[:, None] * N + cols[None, :]).to(tl.float32)
    else:
        zero = _SYMMETRIC_ZERO
    return scale, zero


@triton.jit
def _w4a16_decode_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, perm_ptr, group_index_ptr, bias_ptr, out_ptr, M, N, K, stride_x,
    stride_out, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_GROUP_INDEX: tl.constexpr,
    HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, PDL: tl.constexpr,
):
    """Program pid computes y[:M, cols] for output features cols = [pid * BLOCK_N, +BLOCK_N), M <= BLOCK_M: the
    features' packed words are read once, BLOCK_K / 8 words of each a K slice. A word's eight inputs lie in one group
    (the group is a multiple of 16), so per word and row sum((q - zero) * scale * x) = scale * (sum(q * x) - zero *
    sum(x)); the products stay per word in float32 and are summed over K once, after the loop. With
    HAS_GROUP_INDEX each row looks its group up, and its products are scaled row by row."""
    wait_for_inputs(PDL)
    WORDS: tl.constexpr = BLOCK_K // 8
    pid_n = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    x_rows = x_ptr + tl.minimum(rows, M - 1).to(tl.int64)[:, None] * stride_x  # rows past M: dropped at the store
    cols = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
    word_rows = tl.arange(0, WORDS)
    acc = tl.zeros([BLOCK_M, WORDS, BLOCK_N], tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):  # without dots, pipelined only when asked
        words = tl.load(qweight_ptr + (k // 8 + word_rows)[:, None] * N + cols[None, :])  # [WORDS, BLOCK_N]
        first_rows = k + 8 * word_rows  # each word's
        if HAS_GROUP_INDEX:
            for j in tl.static_range(8):
                q = ((words >> (4 * j)) & 0xF).to(tl.float32)
                x = tl.load(x_rows + first_rows[None, :] + j).to(tl.float32)
                scale, zero = _group_scales(scales_ptr, zeros_ptr, tl.load(group_index_ptr + first_rows + j), cols,
                                            N, HAS_ZEROS)
                acc += (scale * (q - zero))[None, :, :] * x[:, :, None]
        else:
            scale, zero = _group_scales(scales_ptr, zeros_ptr, first_rows // GROUP, cols, N, HAS_ZEROS)
            qx = tl.zeros([BLOCK_M, WORDS, BLOCK_N], tl.float32)
            xs = tl.zeros([BLOCK_M, WORDS], tl.float32)
            for j in tl.static_range(8):
                q = ((words >> (4 * j)) & 0xF).to(tl.float32)
                x = tl.load(x_rows + input_columns(perm_ptr, first_rows + j, HAS_PERM)[None, :]).to(tl.float32)
                qx += q[None, :, :] * x[:, :, None]
                xs += x
            acc += scale[None, :, :] * (qx - zero * xs[:, :, None])
    _store(out_ptr, tl.sum(acc, 1), bias_ptr, rows, rows < M, pid_n, N, stride_out, HAS_BIAS, BLOCK_N)


def _decode_block_k(k: int, largest: int) -> int:
    """The decode kernel's K slice: the largest power of two up to `largest` that divides k."""
    block = largest
    while k % block:
        block //= 2
    return block


def _block_k(group: int, largest: int) -> int:
    """The K slice: the largest power of two up to `largest` that divides the group (a multiple of 16)."""
    block = largest
    while group % block:
        block //= 2
    return block


def w4a16_launch_config(m: int, n: int, k: int, group: int, dtype: torch.dtype, device: torch.device) -> dict:
    """The kernel (decode or GEMM) and its tiles for m rows of n output features and k inputs."""
    decode = m <= DECODE_ROWS
    if device.type != "cuda":  # NOTE: the interpreter pays per program and per loop step: few, large tiles
        tiles = dict(BLOCK_N=min(128, triton.next_power_of_2(n)), BLOCK_K=_block_k(group, 128), num_warps=1)
        if decode:
            return dict(decode=True, BLOCK_M=triton.next_power_of_2(m), STAGES=1) | tiles | dict(
                BLOCK_K=_decode_block_k(k, 128))
        return dict(decode=False, BLOCK_M=min(64, max(16, triton.next_power_of_2(m))), GROUP_M=1) | tiles
    # NOTE: none of these tiles is measured yet (no GPU in the session that wrote them); the decode rule follows
    # fused_linear's measured one (a few features a program, long K slices, 4 warps), widened to 32 features so the
    # N-contiguous words load coalesced, and the GEMM rule follows kernels.fused_moe's table (itself vLLM's).
    # tests/kernels/w4a16_h200_compile.py checks each compiles for the H200 without spills, pipelined.
    if decode:
        return dict(decode=True, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=16, BLOCK_K=_decode_block_k(k, 512),
                    STAGES=3, num_warps=4)
    if m <= 32:
        config = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    elif m <= 128:
        config = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    else:
        config = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    if dtype == torch.float32:  # twice the shared memory per element: half the K slice
        config.update(BLOCK_K=config["BLOCK_K"] // 2, num_stages=2)
    return dict(decode=False) | config | dict(BLOCK_K=_block_k(group, config["BLOCK_K"]))


def w4a16_linear(x: torch.Tensor, weight: W4A16Weight, bias: torch.Tensor | None = None, *,
                 launch_config: dict | None = None, pdl: bool = True) -> torch.Tensor:
    """y = x @ dequantize(weight).T + bias: [M, N] in x's dtype, for x [M, K] (float16, bfloat16 or float32, the
    weight's scales' dtype)."""
    if x.dim() != 2 or x.shape[1] != weight.in_features or x.dtype != weight.scales.dtype or x.stride(1) != 1:
        raise ValueError(f"x {x.dtype} {tuple(x.shape)} does not fit a {weight.scales.dtype} weight of "
                         f"{weight.in_features} inputs (or its rows are not contiguous)")
    if bias is not None and bias.shape != (weight.out_features,):
        raise ValueError(f"bias must be [{weight.out_features}], got {tuple(bias.shape)}")
    m, n = x.shape[0], weight.out_features
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    config = dict(launch_config or w4a16_launch_config(m, n, weight.in_features, weight.slice_rows, x.dtype,
                                                            x.device))
    block_k = config["BLOCK_K"]
    if weight.in_features % block_k or not config["decode"] and weight.slice_rows % block_k:
        raise ValueError(f"a K slice of {block_k} does not divide {weight.in_features} inputs or (in the GEMM) lie "
                         f"within groups of {weight.slice_rows}")
    args = (x, weight.qweight, weight.scales, _or(weight.zeros, x), _or(weight.perm, x), _or(weight.group_index, x),
            _or(bias, x), out, m, n, weight.in_features, x.stride(0), out.stride(0))
    flags = dict(HAS_ZEROS=weight.zeros is not None, HAS_PERM=weight.perm is not None,
                 HAS_GROUP_INDEX=weight.group_index is not None, HAS_BIAS=bias is not None, GROUP=weight.slice_rows,
                 **dependent_launch(x.device, pdl))
    if config.pop("decode"):
        if m > config["BLOCK_M"]:
            raise ValueError(f"the decode kernel takes at most BLOCK_M ({config['BLOCK_M']}) rows, got {m}")
        _w4a16_decode_kernel[(triton.cdiv(n, config["BLOCK_N"]),)](*args, **flags, **config)
    else:
        dot_dtype, precision = dot_config(x.dtype, x.device, kv_fp8=False)
        grid = (triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"]),)
        _w4a16_gemm_kernel[grid](*args, **flags, **config, DOT_DTYPE=dot_dtype, DOT_PRECISION=precision)
    return out


def _or(tensor: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    return placeholder if tensor is None else tensor


def w4a16_linear_ref(x: torch.Tensor, weight: W4A16Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, dequantize(weight), bias)
