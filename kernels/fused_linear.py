"""Linear layers of single-token decode steps, as one weight stream each: y = norm(x) @ W.T, with what the layer
does around the product fused in.

At one row a linear layer is a matrix-vector product: its time is the weight's bytes, and at small models the
launches around it (the RMSNorm before, the SiLU gate after) cost as much again. Here each program reads a slice of
W's rows once and
- before the product, optionally forms h = x + residual, stores it as the new residual, and RMS-normalises h
  (Llama's norm or Gemma's);
- after it, optionally adds a bias and, for the MLP's fused [gate | up] projection, computes act(gate) * up (SiLU or
  Gemma's tanh-approximated GELU).
FP8 (e4m3) weights are streamed as stored, half the bytes, and each output feature's sum is multiplied by its
row's float32 scale (the input row stays in its dtype: weight-only dequantisation).
At two rows and more, cuBLAS's tiled GEMMs reuse each weight tile across rows and win.
"""
import torch
import triton
import triton.language as tl

from sluice.kernels.activation import act_and_mul_ref, activate, check_activation
from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs
from sluice.kernels.rms_norm import apply_norm_weight, rms_norm_ref


@triton.jit
def _load(ptrs, in_k, EVEN_K: tl.constexpr):
    """The elements at ptrs; past K (a last slice that K cuts short) zeros, which add nothing to any sum."""
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=in_k, other=0.0)


@triton.jit
def _input_slice(x_ptr, residual_ptr, ks, K, HAS_RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr):
    """x[ks], or (x + residual)[ks] rounded to x's dtype, as the unfused residual add would leave it."""
    x = _load(x_ptr + ks, ks < K, EVEN_K)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + _load(residual_ptr + ks, ks < K, EVEN_K).to(tl.float32)).to(x.dtype)
    return x


@triton.jit
def _normalise(h, inv_rms, norm_weight_ptr, ks, K, GEMMA_NORM: tl.constexpr, EVEN_K: tl.constexpr):
    w = _load(norm_weight_ptr + ks, ks < K, EVEN_K).to(tl.float32)
    return apply_norm_weight(h.to(tl.float32) * inv_rms, w, h.dtype, GEMMA_NORM)


@triton.jit
def _accumulate(acc, acc_up, a, w_rows, up_offset, ks, K, GATED: tl.constexpr, EVEN_K: tl.constexpr):
    """acc += W[rows, ks] @ a (and acc_up += W[rows + N, ks] @ a when GATED)."""
    a = a.to(tl.float32)[None, :]
    in_k = (ks < K)[None, :]
    acc += tl.sum(_load(w_rows + ks[None, :], in_k, EVEN_K).to(tl.float32) * a, 1)
    if GATED:
        acc_up += tl.sum(_load(w_rows + up_offset + ks[None, :], in_k, EVEN_K).to(tl.float32) * a, 1)
    return acc, acc_up


@triton.jit
def _fused_linear_kernel(
    x_ptr, residual_ptr, norm_weight_ptr, w_ptr, w_scale_ptr, bias_ptr, out_ptr, residual_out_ptr,
    N, K, eps, stride_w,
    NORM: tl.constexpr, GEMMA_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    GATED: tl.constexpr, ACTIVATION: tl.constexpr, HAS_W_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_TILE: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
):
    """Program `pid` computes output features [pid * BLOCK_N, +BLOCK_N) of the one input row.

    With EVEN_K (K a multiple of BLOCK_K) the weight stream needs no masks; else the slices are masked at K. Features
    past N are clamped to the last one and dropped at the store. With GATED, W holds N gate rows and then N up rows,
    and the program reads the matching slices of both. With ONE_TILE (one slice covers K) the input row is read once;
    else the norm takes a first pass over it for the inverse RMS. Program 0 stores the new residual.
    Rounding follows the unfused kernels: the normalised row is rounded to x's dtype before and after the norm
    weight (with GEMMA_NORM, Gemma's, only after it); each product is summed in fp32 and rounded to x's dtype (plus
    bias first) before the gate, whose ACTIVATION is kernels.activation's.
    """
    wait_for_inputs(PDL)
    pid = tl.program_id(0)
    cols = tl.minimum(pid * BLOCK_N + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    w_rows = w_ptr + cols[:, None] * stride_w
    up_offset = N * stride_w
    acc = tl.zeros([BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_N], tl.float32)

    if ONE_TILE:
        ks = tl.arange(0, BLOCK_K)
        a = _input_slice(x_ptr, residual_ptr, ks, K, HAS_RESIDUAL, EVEN_K)
        if NORM:
            if HAS_RESIDUAL:
                if pid == 0:
                    tl.store(residual_out_ptr + ks, a, mask=ks < K)
            h = a.to(tl.float32)
            a = _normalise(a, tl.rsqrt(tl.sum(h * h, 0) / K + eps), norm_weight_ptr, ks, K, GEMMA_NORM, EVEN_K)
        acc, acc_up = _accumulate(acc, acc_up, a, w_rows, up_offset, ks, K, GATED, EVEN_K)
    else:
        if NORM:  # pass 1: the row's inverse RMS
            sum_sq = tl.zeros([BLOCK_K], tl.float32)
            for k in range(0, K, BLOCK_K):
                ks = k + tl.arange(0, BLOCK_K)
                h = _input_slice(x_ptr, residual_ptr, ks, K, HAS_RESIDUAL, EVEN_K)
                if HAS_RESIDUAL:
                    if pid == 0:
                        tl.store(residual_out_ptr + ks, h, mask=ks < K)
                h = h.to(tl.float32)
                sum_sq += h * h
            inv_rms = tl.rsqrt(tl.sum(sum_sq, 0) / K + eps)
        for k in range(0, K, BLOCK_K):  # pass 2: stream the weight rows once
            ks = k + tl.arange(0, BLOCK_K)
            a = _input_slice(x_ptr, residual_ptr, ks, K, HAS_RESIDUAL, EVEN_K)
            if NORM:
                a = _normalise(a, inv_rms, norm_weight_ptr, ks, K, GEMMA_NORM, EVEN_K)
            acc, acc_up = _accumulate(acc, acc_up, a, w_rows, up_offset, ks, K, GATED, EVEN_K)

    # -- epilogue
    dtype = x_ptr.dtype.element_ty
    if HAS_W_SCALE:
        acc *= tl.load(w_scale_ptr + cols)
        if GATED:
            acc_up *= tl.load(w_scale_ptr + N + cols)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols).to(tl.float32)
    y = acc.to(dtype)
    if GATED:
        gate = y.to(tl.float32)
        act = activate(gate, ACTIVATION).to(dtype).to(tl.float32)
        y = (act * acc_up.to(dtype).to(tl.float32)).to(dtype)
    out_cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + out_cols, y.to(out_ptr.dtype.element_ty), mask=out_cols < N)


def _block_k(k: int, largest: int) -> int:
    """The K slice: `largest` where it divides k, else the largest power of two that does, unless that is under a
    quarter of `largest` (gpt-oss's 2880 features would stream in slices of 64): then `largest`, masked at k."""
    block = largest
    while k % block:
        block //= 2
    return block if block * 4 >= largest else min(largest, triton.next_power_of_2(k))


def _launch_config(n: int, k: int, norm: bool, fp8: bool, device: torch.device) -> dict:
    if device.type != "cuda":  # NOTE: the interpreter pays per program and per loop step: few, large tiles
        return dict(BLOCK_N=min(128, triton.next_power_of_2(n)), BLOCK_K=_block_k(k, 256), num_warps=1)
    # NOTE: H200, e4m3 weights, `benchmarks/kernel_linear.py --fp8` (BLOCK_N 1-8 x BLOCK_K 1024-4096 x warps 2/4/8)
    # on Llama-3.1-8B's projections: a program of the bf16 rule below streams half the bytes and waits on its loads
    # (qkv 11.1, o 8.3, gate_up 35.1, down 23.4 us: 2.0-3.3 TB/s). Four output features per program and 2048-wide
    # slices, 2 warps for plain products and 4 for normed ones: 10.4-11.3, 6.7, 33.2, 18.2 us (69.4 us a layer
    # against 77.9; the per-shape best sums to 68.4).
    if fp8 and n < 65536:
        return dict(BLOCK_N=4, BLOCK_K=_block_k(k, 2048), num_warps=4 if norm else 2, num_stages=1)
    # NOTE: H200, bf16, benchmarks/kernel_linear.py (BLOCK_N 1-16 x BLOCK_K 512-4096 x warps 4/8 x stages 1/3 on
    # the ten Qwen3-0.6B and Llama-3.1-8B projections, in CUDA graphs, weights streamed from HBM). The best single
    # rule, within 1% of the per-shape best in total: plain products one output feature per program, normed ones two
    # (each program redoes the norm), the vocabulary-wide lm_head eight (2: 252 us, 8: 235 us at 128256 x 4096);
    # 2048-wide K slices, 4 warps, stages without effect. A norm over at most 4096 features takes the row whole.
    if n >= 65536:
        return dict(BLOCK_N=8, BLOCK_K=_block_k(k, 2048), num_warps=4, num_stages=1)
    return dict(BLOCK_N=2 if norm else 1, BLOCK_K=_block_k(k, 4096 if norm else 2048), num_warps=4, num_stages=1)


def fused_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, norm_weight: torch.Tensor | None = None,
    eps: float = 0.0, residual: torch.Tensor | None = None, gated: bool = False, out_dtype: torch.dtype | None = None,
    weight_scale: torch.Tensor | None = None, gemma_norm: bool = False, activation: str = "silu",
    launch_config: dict | None = None, pdl: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns (y, new_residual) for one row x: [1, K] and weight: [N_w, K].

    h = x + residual (when residual is given; new_residual = h, else None), h' = rms_norm(h, norm_weight, eps,
    gemma_norm) (when norm_weight is given, else h), y = h' @ weight.T + bias: [1, N_w], or with `gated`
    activation(y[:, :N]) * y[:, N:] for N = N_w / 2 (an activation of kernels.activation). y is in x's dtype,
    converted to out_dtype when given. With weight_scale (float32 [N_w]), weight is e4m3 and stands for
    weight * weight_scale[:, None]. Inputs are left untouched.
    """
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"x must be one row [1, K], got {tuple(x.shape)}")
    k = x.shape[1]
    stored_dtype = x.dtype if weight_scale is None else torch.float8_e4m3fn
    if weight.dtype != stored_dtype or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"weight {weight.dtype} {tuple(weight.shape)} does not fit x {x.dtype} {tuple(x.shape)}")
    if residual is not None and (norm_weight is None or residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError("a residual needs a norm_weight and x's shape and dtype")
    check_activation(activation)
    n = weight.shape[0] // 2 if gated else weight.shape[0]
    x = x.contiguous()
    residual = residual.contiguous() if residual is not None else None
    out = torch.empty(1, n, dtype=out_dtype or x.dtype, device=x.device)
    new_residual = torch.empty_like(x) if residual is not None else None
    config = launch_config or _launch_config(n, k, norm_weight is not None, weight_scale is not None, x.device)
    _fused_linear_kernel[(triton.cdiv(n, config["BLOCK_N"]),)](
        x, residual if residual is not None else x, norm_weight if norm_weight is not None else x, weight,
        weight_scale if weight_scale is not None else x, bias if bias is not None else x, out, new_residual if new_residual is not None else out,
        n, k, eps, weight.stride(0),
        NORM=norm_weight is not None, GEMMA_NORM=gemma_norm, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, GATED=gated, ACTIVATION=activation, HAS_W_SCALE=weight_scale is not None,
        ONE_TILE=config["BLOCK_K"] >= k, EVEN_K=k % config["BLOCK_K"] == 0, **config,
        **dependent_launch(x.device, pdl),
    )
    return out, new_residual


def fused_linear_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, norm_weight: torch.Tensor | None = None,
    eps: float = 0.0, residual: torch.Tensor | None = None, gated: bool = False, out_dtype: torch.dtype | None = None,
    weight_scale: torch.Tensor | None = None, gemma_norm: bool = False, activation: str = "silu",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The unfused model code: residual add, RMSNorm, F.linear, act_and_mul, each rounding to x's dtype (an FP8
    weight's product summed in float32 and scaled before the rounding)."""
    new_residual = x + residual if residual is not None else None
    h = new_residual if residual is not None else x
    if norm_weight is not None:
        h = rms_norm_ref(h, norm_weight, eps, gemma_norm)
    if weight_scale is None:
        y = torch.nn.functional.linear(h, weight, bias)
    else:
        y = torch.nn.functional.linear(h.float(), weight.float()) * weight_scale
        y = (y if bias is None else y + bias.float()).to(x.dtype)
    if gated:
        y = act_and_mul_ref(y, activation)
    return y.to(out_dtype or x.dtype), new_residual
