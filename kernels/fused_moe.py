"""The fused mixture-of-experts layer (vLLM's fused_moe): every routed (token, expert) pair of a step in two grouped
GEMM launches, whatever the number of experts.

1. kernels.moe_align sorts the pairs by local expert into blocks of BLOCK_M rows, each block one expert's; a step
   of at most experts / SPARSE_STEP pairs (a decode step of a few tokens) skips it: each pair is its own block.
2. moe_gate_up: one launch over (block, column tile); a program multiplies its block's token rows by its expert's
   gate and up rows (w13 [E, 2I, H]) and stores silu(gate) * up: h [pairs, I], by pair.
3. moe_down: one launch the same way over w2 [E, H, I]; the epilogue multiplies each row by its routing weight:
   y [pairs, H], by pair.
4. out = y viewed as [tokens, top_k, H], summed over the top k (one torch reduction, float32 accumulation).
Padding rows of a block (the sentinel) load zeros and store nothing; programs past the blocks in use return at once,
so the grid depends only on the number of pairs and CUDA graphs replay it. Pairs whose expert lives on another rank
are in no block: their y rows are zeros.

FP8 experts (vLLM's fp8_w8a8 path): e4m3 weights with float32 scales, one per row or one per block of (rows,
columns). Each GEMM's activations are quantized to e4m3 first, per row for per-row scales, per row and group of a
block's columns for block-wise ones (kernels.fp8_quant), and the dots multiply e4m3 by e4m3. Per-row scales factor
out of the sum over K: the epilogue multiplies each accumulator by its row's and its column's scale
(torch._scaled_mm's arithmetic). Block scales multiply each K slice's product, a slice never crossing a group (BLOCK_K
divides the block's columns).

4-bit experts (vLLM's int4_w4a16 path): each projection a kernels.w4a16_layout.W4A16Stack, every expert's weight in
the dense W4A16 layout (int32 words [K / 8, N], scales and zero points [K / group, N]) stacked. Each K slice of the
weight is dequantized in registers (kernels.w4a16_tile, the dense GEMM's tile) into the activation dtype, as the
reference dequantizes the expert first, and fed to the same dots; a slice never crosses a group (BLOCK_K divides it).
With act-order (GPTQ's desc_act) an expert's rows are sorted by group, and the activations' columns are read through
its permutation, as the dense GEMM reads them; a tensor-parallel rank's share of act-order down projections (the
intermediate's columns in their own order) looks each row's group up in the expert's group_index.
The layout is the dense one rather than vLLM's [E, N, K / 2] bytes so that one conversion, one sharding and one
dequantizing tile serve both.
"""
import math

import torch
import triton
import triton.language as tl

from sluice.kernels.activation import act_and_mul_ref
from sluice.kernels.dependent_launch import dependent_launch, wait_for_inputs
from sluice.kernels.fp8_quant import (FP8, quantize_row_groups_fp8, quantize_row_groups_fp8_ref, quantize_rows_fp8,
                                      quantize_rows_fp8_ref)
from sluice.kernels.moe_align import ExpertBlocks, moe_align_block_size, pair_blocks
from sluice.kernels.w4a16_layout import W4A16Stack, dequantize_stack
from sluice.kernels.w4a16_tile import dequantized_tile, input_columns

MOE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SPARSE_STEP = 4  # a step of at most experts / 4 pairs gives each pair its own block, unsorted (as vLLM does)


@triton.jit
def _tile_of(pid, num_blocks, num_col_tiles, GROUP_M: tl.constexpr):
    """(block, column tile) of program pid: GROUP_M blocks sweep each column tile together, so their shared weight
    tile stays in L2 (blocks of one expert sit next to each other)."""
    per_group = GROUP_M * num_col_tiles
    first = pid // per_group * GROUP_M
    size = tl.minimum(num_blocks - first, GROUP_M)
    return first + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def _block_pairs(pid_m, sorted_ids_ptr, block_experts_ptr, num_padded_ptr, num_pairs, BLOCK_M: tl.constexpr,
                 ONE_PAIR_EACH: tl.constexpr):
    """(pairs [BLOCK_M], expert, in use) of block pid_m: its rows' pair ids (num_pairs on padding rows) and its
    expert; a block past those in use, or of a pair on another rank, has nothing to compute."""
    expert = tl.load(block_experts_ptr + pid_m)
    if ONE_PAIR_EACH:
        pairs = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs)
        in_use = expert >= 0
    else:
        pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        in_use = pid_m * BLOCK_M < tl.load(num_padded_ptr)
    return pairs, expert.to(tl.int64), in_use


@triton.jit
def _load_tile(tile, k_mask, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(tile)
    return tl.load(tile, mask=k_mask[:, None], other=0.0)


@triton.jit
def _weight_tile(w_cols, w_scales, w_zeros, w_groups, k, K, stride_wk, stride_sk, EVEN_K: tl.constexpr,
                 INT4_GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_GROUP_INDEX: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """W.T[k : k + BLOCK_K, cols] [BLOCK_K, BLOCK_N]: loaded, or with INT4_GROUP (4-bit weights' run of rows a K
    slice lies within) the slice's words (rows stride_wk apart) dequantized by the scales and zero points (groups
    stride_sk apart) of the slice's group, or with HAS_GROUP_INDEX of each row's group w_groups names."""
    if INT4_GROUP:  # one branch compiles: the two tiles' dtypes differ
        tile = dequantized_tile(w_cols, w_scales, w_zeros, w_groups, k, stride_wk, stride_sk, HAS_ZEROS,
                                HAS_GROUP_INDEX, INT4_GROUP, BLOCK_K, BLOCK_N)
    else:
        ks = k + tl.arange(0, BLOCK_K)
        tile = _load_tile(w_cols + ks[:, None] * stride_wk, ks < K, EVEN_K)
    return tile


@triton.jit
def _expert_product(a_rows, a_perm, a_scales, row_mask, w_cols, w_scales, w_zeros, w_groups, up_offset, w_up_scales,
                    w_up_zeros, K, stride_wk, stride_sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GATED: tl.constexpr, EVEN_K: tl.constexpr, GROUP_K: tl.constexpr,
                    INT4_GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr,
                    HAS_GROUP_INDEX: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] = A[rows, :K] @ W[cols, :K].T in float32 (and acc_up for the rows up_offset further
    on in W, when GATED). a_rows: [BLOCK_M, 1] row pointers (elements contiguous); w_cols: [1, BLOCK_N] pointers to
    the weight rows; padding rows load zeros. With GROUP_K (block-wise FP8), each K slice's product is multiplied by
    its group's scales: a_scales [BLOCK_M] and w_scales (w_up_scales) [BLOCK_N] point to the rows' and the columns'
    first group's, the next groups 1 and stride_sk further on. With INT4_GROUP, w_cols points to the columns' first
    words, and w_scales (w_up_scales) and w_zeros (w_up_zeros) to their first group's scales and zero points; with
    HAS_PERM, A's columns are read through the expert's permutation a_perm [K]; with HAS_GROUP_INDEX, w_groups [K]
    names the group of each of the expert's rows."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a_cols = input_columns(a_perm, ks, HAS_PERM)
        a = tl.load(a_rows + a_cols[None, :], mask=row_mask[:, None] & (ks < K)[None, :], other=0.0).to(DOT_DTYPE)
        w = _weight_tile(w_cols, w_scales, w_zeros, w_groups, k, K, stride_wk, stride_sk, EVEN_K, INT4_GROUP,
                         HAS_ZEROS, HAS_GROUP_INDEX, BLOCK_K, BLOCK_N).to(DOT_DTYPE)
        if GROUP_K:  # the slice lies in one group (BLOCK_K divides GROUP_K)
            a_scale = tl.load(a_scales + k // GROUP_K, mask=row_mask, other=0.0)[:, None]
            w_scale = tl.load(w_scales + k // GROUP_K * stride_sk)[None, :]
            acc += tl.dot(a, w, input_precision=DOT_PRECISION) * a_scale * w_scale
        else:
            acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        if GATED:
            w_up = _weight_tile(w_cols + up_offset, w_up_scales, w_up_zeros, w_groups, k, K, stride_wk, stride_sk,
                                EVEN_K, INT4_GROUP, HAS_ZEROS, HAS_GROUP_INDEX, BLOCK_K, BLOCK_N).to(DOT_DTYPE)
            if GROUP_K:
                w_up_scale = tl.load(w_up_scales + k // GROUP_K * stride_sk)[None, :]
                acc_up += tl.dot(a, w_up, input_precision=DOT_PRECISION) * a_scale * w_up_scale
            else:
                acc_up = tl.dot(a, w_up, acc_up, input_precision=DOT_PRECISION)
    return acc, acc_up


@triton.jit
def _row_scaled(acc, a_scales, row_mask, w_scales):
    """acc [BLOCK_M, BLOCK_N] times its rows' activation scales and its columns' weight scales (per-row FP8)."""
    return acc * tl.load(a_scales, mask=row_mask, other=0.0)[:, None] * tl.load(w_scales)[None, :]


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def _moe_gate_up_kernel(
    x_ptr, w13_ptr, h_ptr, a_scale_ptr, w_scale_ptr, w_zero_ptr, perm_ptr, group_index_ptr, bias_ptr, sorted_ids_ptr,
    block_experts_ptr, num_padded_ptr, num_pairs, num_blocks, hidden, intermediate,
    stride_xt, stride_we, stride_wn, stride_wk, stride_ht, stride_as, stride_se, stride_sn, stride_sk, stride_pe,
    stride_ge, stride_be,
    HAS_BIAS: tl.constexpr, SWIGLU_ALPHA: tl.constexpr, SWIGLU_LIMIT: tl.constexpr, TOP_K: tl.constexpr,
    ONE_PAIR_EACH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, ROW_SCALES: tl.constexpr, GROUP_N: tl.constexpr,
    GROUP_K: tl.constexpr, INT4_GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr,
    HAS_GROUP_INDEX: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    """Program (block, column tile) computes h[pair, n] = silu(w13[e, n] . x[token]) * (w13[e, I + n] . x[token])
    for the block's pairs (token = pair // TOP_K, e the block's expert) and BLOCK_N columns n of the intermediate.

    One pass over the hidden dimension feeds two accumulators (gate and up tiles of the same columns), and the
    SiLU-and-mul runs in the epilogue, rounding as the unfused model code does (each product to the model dtype,
    silu in float32 and rounded, then the product rounded): the [pairs, 2I] projection never exists. Columns past
    the intermediate size wrap around (loads need no mask) and are not stored. With HAS_BIAS, bias [E, 2I] adds to
    the gate and up products; SWIGLU_LIMIT > 0 takes gpt-oss's clamped SwiGLU for the SiLU-and-mul:
    (clamp(up, -limit, limit) + 1) * g * sigmoid(SWIGLU_ALPHA * g), g = min(gate, limit).
    """
    wait_for_inputs(PDL)
    pid_m, pid_n = _tile_of(tl.program_id(0), num_blocks, tl.cdiv(intermediate, BLOCK_N), GROUP_M)
    pairs, expert, in_use = _block_pairs(pid_m, sorted_ids_ptr, block_experts_ptr, num_padded_ptr, num_pairs,
                                         BLOCK_M, ONE_PAIR_EACH)
    if not in_use:
        return
    row_mask = pairs < num_pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)

    # -- gate and up products of the block's tokens
    tokens = (pairs // TOP_K).to(tl.int64)
    a_rows = x_ptr + tokens[:, None] * stride_xt
    w_cols = w13_ptr + expert * stride_we + (cols % intermediate).to(tl.int64)[None, :] * stride_wn
    a_scales = a_scale_ptr + tokens * stride_as
    scale_cols = expert * stride_se + (cols % intermediate // GROUP_N) * stride_sn
    up_scale_cols = expert * stride_se + ((intermediate + cols % intermediate) // GROUP_N) * stride_sn
    w_scales, w_up_scales = w_scale_ptr + scale_cols, w_scale_ptr + up_scale_cols
    gate, up = _expert_product(a_rows, perm_ptr + expert * stride_pe, a_scales, row_mask, w_cols, w_scales,
                               w_zero_ptr + scale_cols, group_index_ptr + expert * stride_ge, intermediate * stride_wn,
                               w_up_scales, w_zero_ptr + up_scale_cols, hidden, stride_wk, stride_sk, BLOCK_M, BLOCK_N,
                               BLOCK_K, True, EVEN_K, GROUP_K, INT4_GROUP, HAS_ZEROS, HAS_PERM, HAS_GROUP_INDEX,
                               DOT_DTYPE, DOT_PRECISION)
    if ROW_SCALES:
        gate = _row_scaled(gate, a_scales, row_mask, w_scales)
        up = _row_scaled(up, a_scales, row_mask, w_up_scales)
    if HAS_BIAS:
        biases = bias_ptr + expert * stride_be + cols % intermediate
        gate += tl.load(biases).to(tl.float32)[None, :]
        up += tl.load(biases + intermediate).to(tl.float32)[None, :]

    # -- epilogue: silu(gate) * up, or the clamped SwiGLU
    dtype = h_ptr.dtype.element_ty
    gate = gate.to(dtype).to(tl.float32)
    up = up.to(dtype).to(tl.float32)
    if SWIGLU_LIMIT > 0:
        gate = tl.minimum(gate, SWIGLU_LIMIT)
        up = tl.minimum(tl.maximum(up, -SWIGLU_LIMIT), SWIGLU_LIMIT)
        h = ((up + 1.0) * (gate / (1.0 + tl.exp(-SWIGLU_ALPHA * gate)))).to(dtype)
    else:
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        h = (act * up).to(dtype)
    h_ptrs = h_ptr + pairs.to(tl.int64)[:, None] * stride_ht + cols[None, :]
    tl.store(h_ptrs, h, mask=row_mask[:, None] & (cols < intermediate)[None, :])


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def _moe_down_kernel(
    h_ptr, w2_ptr, topk_weights_ptr, y_ptr, a_scale_ptr, w_scale_ptr, w_zero_ptr, perm_ptr, group_index_ptr, bias_ptr,
    sorted_ids_ptr, block_experts_ptr, num_padded_ptr, num_pairs, num_blocks, hidden, intermediate,
    stride_ht, stride_we, stride_wn, stride_wk, stride_yt, stride_as, stride_se, stride_sn, stride_sk, stride_pe,
    stride_ge, stride_be,
    HAS_BIAS: tl.constexpr, ONE_PAIR_EACH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, ROW_SCALES: tl.constexpr,
    GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, INT4_GROUP: tl.constexpr, HAS_ZEROS: tl.constexpr,
    HAS_PERM: tl.constexpr, HAS_GROUP_INDEX: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (block, column tile) computes y[pair, n] = topk_weights[pair] * (w2[e, n] . h[pair]) for the
    block's pairs and BLOCK_N hidden columns n (plus bias[e, n] with HAS_BIAS). The product is rounded to the model
    dtype before the routing weight (itself rounded to the model dtype) multiplies it, as the model code does."""
    wait_for_inputs(PDL)
    pid_m, pid_n = _tile_of(tl.program_id(0), num_blocks, tl.cdiv(hidden, BLOCK_N), GROUP_M)
    pairs, expert, in_use = _block_pairs(pid_m, sorted_ids_ptr, block_experts_ptr, num_padded_ptr, num_pairs,
                                         BLOCK_M, ONE_PAIR_EACH)
    if not in_use:
        return
    row_mask = pairs < num_pairs
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)

    # -- down products of the block's rows of h
    a_rows = h_ptr + pairs.to(tl.int64)[:, None] * stride_ht
    w_cols = w2_ptr + expert * stride_we + (cols % hidden).to(tl.int64)[None, :] * stride_wn
    a_scales = a_scale_ptr + pairs.to(tl.int64) * stride_as
    scale_cols = expert * stride_se + (cols % hidden // GROUP_N) * stride_sn
    w_scales, w_zeros = w_scale_ptr + scale_cols, w_zero_ptr + scale_cols
    acc, _ = _expert_product(a_rows, perm_ptr + expert * stride_pe, a_scales, row_mask, w_cols, w_scales, w_zeros,
                             group_index_ptr + expert * stride_ge, 0, w_scales, w_zeros, intermediate, stride_wk,
                             stride_sk, BLOCK_M, BLOCK_N, BLOCK_K, False, EVEN_K, GROUP_K, INT4_GROUP, HAS_ZEROS,
                             HAS_PERM, HAS_GROUP_INDEX, DOT_DTYPE, DOT_PRECISION)
    if ROW_SCALES:
        acc = _row_scaled(acc, a_scales, row_mask, w_scales)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert * stride_be + cols % hidden).to(tl.float32)[None, :]

    # -- epilogue: times the routing weight
    dtype = y_ptr.dtype.element_ty
    weight = tl.load(topk_weights_ptr + pairs, mask=row_mask, other=0.0).to(dtype).to(tl.float32)
    y = (acc.to(dtype).to(tl.float32) * weight[:, None]).to(dtype)
    y_ptrs = y_ptr + pairs.to(tl.int64)[:, None] * stride_yt + cols[None, :]
    tl.store(y_ptrs, y, mask=row_mask[:, None] & (cols < hidden)[None, :])


def moe_launch_config(num_tokens: int, top_k: int, num_experts: int, hidden: int, intermediate: int,
                      dtype: torch.dtype, device: torch.device) -> dict:
    """BLOCK_M (rows of a block, kernels.moe_align's block_m), BLOCK_N (columns of the gate_up projection's 2I
    outputs, gate and up halves, and of the down projection's H), BLOCK_K, GROUP_M, num_warps, num_stages.
    dtype: the dots' operands' (e4m3 for FP8 experts)."""
    if device.type != "cuda":  # NOTE: the interpreter pays per program: few, but small enough tiles to cross masks
        return dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=1, num_stages=1)
    # NOTE: not measured with these kernels yet. The table follows vLLM's tuned configs for Qwen3-30B-A3B's experts
    # (E=128, N=768, bf16) on the H100 and the H200 (configs/E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json and
    # ..._H200.json), which agree on the regime boundaries, keyed here by the expected rows per expert
    # (tokens * top_k / experts) rather than by tokens, so models with few experts (Mixtral: 8, top-2) reach the
    # large tiles at fewer tokens. Their BLOCK_N counts the 2I-wide gate_up output, as here. To retune on a GPU:
    # `python benchmarks/fused_moe.py OUT.json --sweep`. FP8 experts take the same tiles, unmeasured too (e4m3
    # operands fill half the shared memory: the H200 compile of tests/kernels/moe_h200_compile.py). 4-bit experts
    # take them too, unmeasured (their K slice cut to divide the group; the same compile: pipelined, no spills).
    rows_per_expert = num_tokens * top_k / num_experts
    if rows_per_expert < 2:  # decode: each expert's block has a row or two; the weights stream once
        config = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
    elif rows_per_expert < 16:
        config = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)
    elif rows_per_expert < 32:
        config = dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4, num_stages=3)
    elif rows_per_expert < 64:
        config = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    else:  # prefill: tensor-core bound tiles
        config = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    if dtype == torch.float32:  # NOTE: twice the shared memory per element: half the K slice (unmeasured)
        config.update(BLOCK_K=config["BLOCK_K"] // 2, num_stages=2)
    # a tile no larger than the shape needs (the gate_up tile's halves at least 16 columns, tl.dot's minimum; an
    # e4m3 dot's K at least 32, the FP8 MMA's)
    config["BLOCK_N"] = max(32, min(config["BLOCK_N"], triton.next_power_of_2(2 * min(hidden, intermediate))))
    config["BLOCK_K"] = max(32 if dtype == FP8 else 16,
                            min(config["BLOCK_K"], triton.next_power_of_2(min(hidden, intermediate))))
    return config


def _dot_config(dtype: torch.dtype, device: torch.device) -> tuple[tl.dtype, str]:
    """The dtype tl.dot multiplies in, by its A operand's (the weights are converted to it).
    NOTE: the interpreter runs tl.dot on bfloat16's raw bits (see kernels.paged_kv.dot_config), so off CUDA the
    dots run in float32; on CUDA e4m3 and 16-bit operands go to the tensor cores as they are, float32 ones exactly."""
    if device.type != "cuda" or dtype == torch.float32:
        return tl.float32, "ieee"
    return {FP8: tl.float8e4nv, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype], "tf32"


def _kernel_options(config: dict, k: int, a: torch.Tensor, scales: dict, pdl: bool) -> dict:
    """scales: _scaled_operands'; the K slice divides block-wise FP8 weights' columns per block and 4-bit weights'
    groups."""
    group_k = scales["GROUP_K"] or scales["INT4_GROUP"]
    block_k = math.gcd(config["BLOCK_K"], group_k) if group_k else config["BLOCK_K"]
    if block_k < 16:
        raise ValueError(f"weight groups of {group_k} columns: a GEMM's K slice must divide them and hold 16")
    dot_dtype, precision = _dot_config(a.dtype, a.device)
    return dict(BLOCK_K=block_k, GROUP_M=config["GROUP_M"], EVEN_K=k % block_k == 0, DOT_DTYPE=dot_dtype,
                DOT_PRECISION=precision, num_warps=config["num_warps"], num_stages=config["num_stages"],
                **dependent_launch(a.device, pdl))


def _check_blocks(blocks: ExpertBlocks, config: dict) -> None:
    if blocks.block_m != config["BLOCK_M"]:
        raise ValueError(f"blocks of {blocks.block_m} rows, config BLOCK_M {config['BLOCK_M']}")


def _scaled_operands(name: str, a: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None,
                     block_shape: tuple[int, int] | None,
                     absmax_bound: float | None) -> tuple[torch.Tensor, dict]:
    """(the GEMM's A operand, its kernel's scale arguments) for a (rows of activations) and weight [E, N, K]: a as it
    is for a weight in a's dtype; for an e4m3 weight, a's rows quantized to e4m3 under absmax_bound, whole or in
    groups of block_shape's columns (off CUDA by the torch twin, the same arithmetic: the interpreter rounds FP8
    stores wrongly). A 4-bit weight's: its scales and zero points, a group's row stride_sk further on, and its
    experts' act-order permutations or group indexes."""
    if isinstance(weight, W4A16Stack):
        if weight.scales.dtype != a.dtype:
            raise ValueError(f"{name}'s 4-bit scales in {weight.scales.dtype} do not fit activations in {a.dtype}")
        zeros = weight.scales if weight.zeros is None else weight.zeros
        return a, dict(a_scale_ptr=a, w_scale_ptr=weight.scales, w_zero_ptr=zeros, stride_as=0,
                       stride_se=weight.scales.stride(0), stride_sn=1, stride_sk=weight.scales.stride(1),
                       ROW_SCALES=False, GROUP_N=1, GROUP_K=0, INT4_GROUP=weight.slice_rows,
                       HAS_ZEROS=weight.zeros is not None, **_row_index("perm", "pe", weight.perm, a),
                       **_row_index("group_index", "ge", weight.group_index, a))
    unquantized = dict(INT4_GROUP=0, HAS_ZEROS=False, **_row_index("perm", "pe", None, a),
                       **_row_index("group_index", "ge", None, a))
    if weight_scale is None:
        if weight.dtype != a.dtype:
            raise ValueError(f"{name} {weight.dtype} does not fit activations in {a.dtype} (e4m3 weights take scales)")
        return a, dict(a_scale_ptr=a, w_scale_ptr=weight, w_zero_ptr=weight, stride_as=0, stride_se=0, stride_sn=0,
                       stride_sk=0, ROW_SCALES=False, GROUP_N=1, GROUP_K=0, **unquantized)
    _check_scale(name, weight, weight_scale, block_shape)
    if block_shape is None:
        a_q, a_scale = (quantize_rows_fp8 if a.is_cuda else quantize_rows_fp8_ref)(a, absmax_bound=absmax_bound)
        return a_q, dict(a_scale_ptr=a_scale, w_scale_ptr=weight_scale, w_zero_ptr=weight_scale, stride_as=1,
                         stride_se=weight_scale.stride(0), stride_sn=weight_scale.stride(1), stride_sk=0,
                         ROW_SCALES=True, GROUP_N=1, GROUP_K=0, **unquantized)
    quantize = quantize_row_groups_fp8 if a.is_cuda else quantize_row_groups_fp8_ref
    a_q, a_scale = quantize(a, block_shape[1], absmax_bound)
    return a_q, dict(a_scale_ptr=a_scale, w_scale_ptr=weight_scale, w_zero_ptr=weight_scale,
                     stride_as=a_scale.stride(0), stride_se=weight_scale.stride(0), stride_sn=weight_scale.stride(1),
                     stride_sk=weight_scale.stride(2), ROW_SCALES=False, GROUP_N=block_shape[0],
                     GROUP_K=block_shape[1], **unquantized)


def _row_index(name: str, stride: str, index: torch.Tensor | None, placeholder: torch.Tensor) -> dict:
    """A GEMM kernel's arguments for a 4-bit stack's index of its experts' rows [E, K] (perm or group_index), or for
    none (the placeholder stands in)."""
    return {f"{name}_ptr": placeholder if index is None else index, f"stride_{stride}": 0 if index is None else
            index.stride(0), f"HAS_{name.upper()}": index is not None}


def _check_scale(name: str, weight: torch.Tensor, scale: torch.Tensor, block_shape: tuple[int, int] | None) -> None:
    """An e4m3 weight [E, N, K] takes float32 scales [E, N], or [E, ceil(N / rows), ceil(K / columns)] for blocks of
    block_shape (rows, columns)."""
    num_experts, rows, columns = weight.shape
    expected = (num_experts, rows) if block_shape is None else \
        (num_experts, -(-rows // block_shape[0]), -(-columns // block_shape[1]))
    if weight.dtype != FP8 or scale.dtype != torch.float32 or tuple(scale.shape) != expected:
        raise ValueError(f"{name} {weight.dtype} with scale {scale.dtype} {tuple(scale.shape)}: e4m3 weights take a "
                         f"float32 scale {expected}")


def moe_gate_up(x: torch.Tensor, w13: torch.Tensor | W4A16Stack, blocks: ExpertBlocks, top_k: int, config: dict,
                w13_scale: torch.Tensor | None = None, block_shape: tuple[int, int] | None = None,
                absmax_bound: float | None = None, pdl: bool = True, bias: torch.Tensor | None = None,
                swiglu: tuple[float, float] | None = None) -> torch.Tensor:
    """h [T * top_k, I] in x's dtype: h[pair] = silu(w13[e, :I] @ x[token]) * (w13[e, I:] @ x[token]) for every
    pair in blocks (pair = token * top_k + slot, e its block's expert). Rows of pairs in no block are not written.
    x: [T, H]; w13: [E, 2I, H] (gate rows, then up rows) in x's dtype, e4m3 with w13_scale, or 4-bit (see
    fused_experts);
    bias [E, 2I] adds to both products; swiglu (alpha, limit): the clamped SwiGLU instead (see fused_experts)."""
    _check_blocks(blocks, config)
    num_tokens, hidden = x.shape
    if len(w13.shape) != 3 or w13.shape[1] % 2 or w13.shape[2] != hidden:
        raise ValueError(f"w13 {tuple(w13.shape)} does not fit x {tuple(x.shape)}")
    intermediate = w13.shape[1] // 2
    x = x if x.stride(1) == 1 else x.contiguous()
    h = torch.empty(num_tokens * top_k, intermediate, dtype=x.dtype, device=x.device)
    if block_shape is not None and intermediate % block_shape[0]:
        raise ValueError(f"w13's gate and up halves of {intermediate} rows are no whole FP8 blocks of "
                         f"{block_shape[0]}")
    a, scales = _scaled_operands("w13", x, w13, w13_scale, block_shape, absmax_bound)
    w13_words, w13_strides = _weight_arguments(w13)
    num_blocks = blocks.block_experts.shape[0]
    block_n = config["BLOCK_N"] // 2
    alpha, limit = swiglu or (0.0, 0.0)
    if num_blocks:
        _moe_gate_up_kernel[(num_blocks * triton.cdiv(intermediate, block_n),)](
            a, w13_words, h, **_bias_arguments(bias, w13.shape, w13_words), SWIGLU_ALPHA=alpha, SWIGLU_LIMIT=limit,
            **_block_arguments(blocks), num_pairs=h.shape[0], num_blocks=num_blocks, hidden=hidden,
            intermediate=intermediate, stride_xt=a.stride(0), **w13_strides, stride_ht=h.stride(0), TOP_K=top_k,
            BLOCK_N=block_n,
            **scales, **_kernel_options(config, hidden, a, scales, pdl),
        )
    return h


def moe_down(h: torch.Tensor, w2: torch.Tensor | W4A16Stack, topk_weights: torch.Tensor, blocks: ExpertBlocks,
             config: dict, zero_unrouted: bool = False, w2_scale: torch.Tensor | None = None,
             block_shape: tuple[int, int] | None = None, absmax_bound: float | None = None,
             pdl: bool = True, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [pairs, H] in h's dtype: y[pair] = topk_weights[pair] * (w2[e] @ h[pair] + bias[e]) for every pair in
    blocks. Rows of pairs in no block are zeros with zero_unrouted, else not written. h: [pairs, I]; w2: [E, H, I] in
    h's dtype, e4m3 with w2_scale, or 4-bit (see fused_experts); topk_weights: float32 with one weight per pair
    ([T, top_k]); bias: [E, H] or None."""
    _check_blocks(blocks, config)
    num_pairs, intermediate = h.shape
    if len(w2.shape) != 3 or w2.shape[2] != intermediate:
        raise ValueError(f"w2 {tuple(w2.shape)} does not fit h {tuple(h.shape)}")
    if topk_weights.numel() != num_pairs or topk_weights.dtype != torch.float32:
        raise ValueError(f"topk_weights must be float32 with {num_pairs} weights, got {topk_weights.dtype} "
                         f"{tuple(topk_weights.shape)}")
    hidden = w2.shape[1]
    weights = topk_weights.reshape(-1).contiguous()
    h = h if h.stride(1) == 1 else h.contiguous()
    y = (torch.zeros if zero_unrouted else torch.empty)(num_pairs, hidden, dtype=h.dtype, device=h.device)
    a, scales = _scaled_operands("w2", h, w2, w2_scale, block_shape, absmax_bound)
    w2_words, w2_strides = _weight_arguments(w2)
    num_blocks = blocks.block_experts.shape[0]
    if num_blocks:
        _moe_down_kernel[(num_blocks * triton.cdiv(hidden, config["BLOCK_N"]),)](
            a, w2_words, weights, y, **_bias_arguments(bias, w2.shape, w2_words), **_block_arguments(blocks),
            num_pairs=num_pairs,
            num_blocks=num_blocks, hidden=hidden, intermediate=intermediate, stride_ht=a.stride(0),
            **w2_strides, stride_yt=y.stride(0),
            BLOCK_N=config["BLOCK_N"],
            **scales, **_kernel_options(config, intermediate, a, scales, pdl),
        )
    return y


def _block_arguments(blocks: ExpertBlocks) -> dict:
    """A GEMM kernel's arguments for the step's blocks (pair_blocks' have no sorted list: any pointer stands in)."""
    return dict(sorted_ids_ptr=blocks.block_experts if blocks.one_pair_each else blocks.sorted_ids,
                block_experts_ptr=blocks.block_experts,
                num_padded_ptr=blocks.block_experts if blocks.one_pair_each else blocks.num_padded,
                BLOCK_M=blocks.block_m, ONE_PAIR_EACH=blocks.one_pair_each)


def _weight_arguments(weight: torch.Tensor | W4A16Stack) -> tuple[torch.Tensor, dict]:
    """(the tensor a GEMM kernel reads of weight [E, N, K], its strides along experts, N and K): a 4-bit stack's
    words, whose rows (eight inputs each) stride_wk apart."""
    if isinstance(weight, W4A16Stack):
        words = weight.qweight
        return words, dict(stride_we=words.stride(0), stride_wn=1, stride_wk=words.stride(1))
    return weight, dict(stride_we=weight.stride(0), stride_wn=weight.stride(1), stride_wk=weight.stride(2))


def _bias_arguments(bias: torch.Tensor | None, shape: tuple[int, ...], placeholder: torch.Tensor) -> dict:
    """A GEMM kernel's bias arguments for a weight of shape [E, N, K]: bias [E, N] (contiguous rows), or None (the
    placeholder stands in)."""
    if bias is None:
        return dict(bias_ptr=placeholder, stride_be=0, HAS_BIAS=False)
    if tuple(bias.shape) != tuple(shape[:2]) or bias.stride(1) != 1:
        raise ValueError(f"a bias of {tuple(bias.shape)} for weights {tuple(shape)}: it must be "
                         f"{tuple(shape[:2])} with contiguous rows")
    return dict(bias_ptr=bias, stride_be=bias.stride(0), HAS_BIAS=True)


def _check_experts(x, topk_weights, topk_ids, w13, w2, expert_map, w13_scale, w2_scale) -> None:
    if x.dim() != 2 or x.dtype not in MOE_DTYPES:
        raise ValueError(f"x must be [num_tokens, hidden] in {MOE_DTYPES}, got {x.dtype} {tuple(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must be "
                         f"[{x.shape[0]}, top_k]")
    if len(w13.shape) != 3 or len(w2.shape) != 3 or w2.shape[0] != w13.shape[0] or w13.shape[1] != 2 * w2.shape[2] \
            or w13.shape[2] != x.shape[1] or w2.shape[1] != x.shape[1]:
        raise ValueError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} must be [E, 2I, H] and [E, H, I] with "
                         f"H = {x.shape[1]}")
    if (w13_scale is None) != (w2_scale is None):
        raise ValueError("w13 and w2 must both be e4m3 with scales, or neither")
    four_bit = isinstance(w13, W4A16Stack)
    if four_bit != isinstance(w2, W4A16Stack) or four_bit and w13_scale is not None:
        raise ValueError("w13 and w2 must both be 4-bit stacks (without e4m3 scales), or neither")
    if expert_map is not None and expert_map.dim() != 1:
        raise ValueError(f"expert_map must be [global_experts], got {tuple(expert_map.shape)}")


def fused_experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  w13: torch.Tensor | W4A16Stack, w2: torch.Tensor | W4A16Stack, expert_map: torch.Tensor | None = None,
                  w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  block_shape: tuple[int, int] | None = None, absmax_bound: float | None = None,
                  launch_config: dict | None = None, pdl: bool = True, w13_bias: torch.Tensor | None = None,
                  w2_bias: torch.Tensor | None = None, swiglu: tuple[float, float] | None = None) -> torch.Tensor:
    """The routed experts' output [T, H] in x's dtype:
    out[t] = sum over slots j with a local expert e of topk_weights[t, j] * (w2[e] @ (silu(w13[e, :I] @ x[t]) *
    (w13[e, I:] @ x[t]))).
    gpt-oss's experts: w13_bias [E, 2I] and w2_bias [E, H] add to the products, and swiglu (alpha, limit) takes the
    clamped SwiGLU (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit), for silu(gate) * up.

    x: [T, H]; topk_weights: float32 [T, k]; topk_ids: int32 [T, k], global expert ids; w13: [E, 2I, H] (gate rows,
    then up rows); w2: [E, H, I]; expert_map: None (ids are local) or int32 [global experts] -> local index, -1 for
    an expert on another rank (its pairs add nothing). launch_config: moe_launch_config's keys (None picks them).
    pdl: the kernels take programmatic dependent launch where the GPU has it (kernels.dependent_launch).
    FP8 experts: w13 and w2 in e4m3 with float32 w13_scale [E, 2I] and w2_scale [E, H], one per row, or with
    block_shape (rows, columns) one per block, w13_scale [E, 2I / rows, ceil(H / columns)] and w2_scale
    [E, ceil(H / rows), ceil(I / columns)] (I a multiple of rows); absmax_bound clips the activations' absolute
    maxima before they are quantized.
    4-bit experts: w13 and w2 W4A16Stacks of shapes [E, 2I, H] and [E, H, I], their scales in x's dtype, their
    group size a multiple of 16 (the K slice divides it), act-order or not.
    """
    _check_experts(x, topk_weights, topk_ids, w13, w2, expert_map, w13_scale, w2_scale)
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_experts, intermediate = w2.shape[0], w2.shape[2]
    if num_tokens == 0:
        return torch.empty_like(x)
    dot_dtype = x.dtype if w13_scale is None else FP8
    config = launch_config or moe_launch_config(num_tokens, top_k, num_experts, hidden, intermediate, dot_dtype,
                                                x.device)
    if expert_map is None and num_tokens * top_k * SPARSE_STEP <= num_experts:
        blocks = pair_blocks(topk_ids, config["BLOCK_M"])
    else:
        blocks = moe_align_block_size(topk_ids, num_experts, config["BLOCK_M"], expert_map, pdl=pdl)
    options = dict(block_shape=block_shape, absmax_bound=absmax_bound, pdl=pdl)
    h = moe_gate_up(x, w13, blocks, top_k, config, w13_scale, **options, bias=w13_bias, swiglu=swiglu)  # [T * k, I]
    y = moe_down(h, w2, topk_weights, blocks, config, expert_map is not None, w2_scale, **options,
                 bias=w2_bias)  # [T * k, H]
    return y.view(num_tokens, hidden) if top_k == 1 else y.view(num_tokens, top_k, hidden).sum(1)


def _expert_linear_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None,
                       block_shape: tuple[int, int] | None, absmax_bound: float | None,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias in x's dtype. An e4m3 weight's product as the dense FP8 GEMM computes it: x's rows quantized
    to e4m3 (whole, or in groups of block_shape's columns), both operands dequantized, multiplied in float32, the bias
    added to the scaled product before it is rounded."""
    if scale is None:
        return torch.nn.functional.linear(x, weight, bias)
    if block_shape is None:
        x_q, x_scale = quantize_rows_fp8_ref(x, absmax_bound=absmax_bound)
        product = (x_q.float() @ weight.float().T) * x_scale[:, None] * scale[None, :]
    else:
        x_q, x_scale = quantize_row_groups_fp8_ref(x, block_shape[1], absmax_bound)
        x_real = _dequantized_blocks(x_q, x_scale, (1, block_shape[1]))[:, :x.shape[1]]
        product = x_real @ _dequantized_blocks(weight, scale, block_shape).T
    return (product if bias is None else product + bias.float()).to(x.dtype)


def _dequantized_blocks(values: torch.Tensor, scale: torch.Tensor, block_shape: tuple[int, int]) -> torch.Tensor:
    """float32 values times the scale of the block each lies in (blocks cut at the edges)."""
    rows, columns = values.shape
    scale = scale.repeat_interleave(block_shape[0], 0)[:rows].repeat_interleave(block_shape[1], 1)[:, :columns]
    return values.float() * scale


def moe_gate_up_ref(x: torch.Tensor, w13: torch.Tensor | W4A16Stack, blocks: ExpertBlocks, top_k: int,
                    w13_scale: torch.Tensor | None = None, block_shape: tuple[int, int] | None = None,
                    absmax_bound: float | None = None) -> torch.Tensor:
    """Plain torch, one expert at a time over the pairs in blocks (4-bit experts dequantized first); rows of pairs
    in no block are zeros."""
    w13 = _dense(w13)
    h = torch.zeros(x.shape[0] * top_k, w13.shape[1] // 2, dtype=x.dtype, device=x.device)
    for expert, pairs in _pairs_by_expert(blocks, h.shape[0]):
        scale = None if w13_scale is None else w13_scale[expert]
        h[pairs] = act_and_mul_ref(_expert_linear_ref(x[pairs // top_k], w13[expert], scale, block_shape,
                                                      absmax_bound), "silu")
    return h


def moe_down_ref(h: torch.Tensor, w2: torch.Tensor | W4A16Stack, topk_weights: torch.Tensor, blocks: ExpertBlocks,
                 w2_scale: torch.Tensor | None = None, block_shape: tuple[int, int] | None = None,
                 absmax_bound: float | None = None) -> torch.Tensor:
    """Plain torch, one expert at a time (4-bit experts dequantized first); rows of pairs in no block are zeros."""
    w2 = _dense(w2)
    y = torch.zeros(h.shape[0], w2.shape[1], dtype=h.dtype, device=h.device)
    weights = topk_weights.reshape(-1)
    for expert, pairs in _pairs_by_expert(blocks, h.shape[0]):
        scale = None if w2_scale is None else w2_scale[expert]
        product = _expert_linear_ref(h[pairs], w2[expert], scale, block_shape, absmax_bound)
        y[pairs] = product * weights[pairs, None].to(h.dtype)
    return y


def _pairs_by_expert(blocks: ExpertBlocks, num_pairs: int):
    """(expert, int64 pair ids) for each expert with a block."""
    if blocks.one_pair_each:
        rows, experts = torch.arange(num_pairs, device=blocks.block_experts.device), blocks.block_experts
    else:
        rows = blocks.sorted_ids[:int(blocks.num_padded)].long()
        experts = blocks.block_experts.repeat_interleave(blocks.block_m)[:rows.numel()]
    routed = rows < num_pairs
    for expert in experts[routed].unique().tolist():
        yield expert, rows[routed & (experts == expert)]


def fused_experts_ref(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      w13: torch.Tensor | W4A16Stack, w2: torch.Tensor | W4A16Stack,
                      expert_map: torch.Tensor | None = None, w13_scale: torch.Tensor | None = None,
                      w2_scale: torch.Tensor | None = None, block_shape: tuple[int, int] | None = None,
                      absmax_bound: float | None = None, w13_bias: torch.Tensor | None = None,
                      w2_bias: torch.Tensor | None = None, swiglu: tuple[float, float] | None = None) -> torch.Tensor:
    """Plain torch as Hugging Face's sparse MoE blocks compute it: one local expert at a time over its tokens, its
    output times the routing weight (in x's dtype) added into the result in x's dtype. FP8 experts' products as the
    dense FP8 GEMM computes them (_expert_linear_ref), biases added to the (scaled) products; the clamped SwiGLU as
    gpt-oss computes it; 4-bit experts dequantized first (kernels.w4a16_layout.dequantize_stack)."""
    _check_experts(x, topk_weights, topk_ids, w13, w2, expert_map, w13_scale, w2_scale)
    w13, w2 = _dense(w13), _dense(w2)
    experts = topk_ids.long() if expert_map is None else expert_map.long()[topk_ids.long()]
    out = torch.zeros_like(x)
    for expert in range(w13.shape[0]):
        tokens, slots = torch.where(experts == expert)
        if tokens.numel() == 0:
            continue
        gate_up = _expert_linear_ref(x[tokens], w13[expert], _of(w13_scale, expert), block_shape, absmax_bound,
                                     _of(w13_bias, expert))
        y = _expert_linear_ref(_gated_ref(gate_up, swiglu), w2[expert], _of(w2_scale, expert), block_shape,
                               absmax_bound, _of(w2_bias, expert))
        out.index_add_(0, tokens, y * topk_weights[tokens, slots, None].to(x.dtype))
    return out


def _dense(weight: torch.Tensor | W4A16Stack) -> torch.Tensor:
    return dequantize_stack(weight) if isinstance(weight, W4A16Stack) else weight


def _of(stacked: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    """An expert's entry of stacked scales or biases, which the experts may lack."""
    return None if stacked is None else stacked[expert]


def _gated_ref(gate_up: torch.Tensor, swiglu: tuple[float, float] | None) -> torch.Tensor:
    """silu(gate) * up, or with swiglu (alpha, limit) gpt-oss's clamped SwiGLU, computed in float32 and rounded once
    to gate_up's dtype, as the gate/up kernel's epilogue computes it."""
    if swiglu is None:
        return act_and_mul_ref(gate_up, "silu")
    alpha, limit = swiglu
    gate, up = gate_up.float().chunk(2, dim=-1)
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return ((up + 1) * (gate * torch.sigmoid(gate * alpha))).to(gate_up.dtype)
