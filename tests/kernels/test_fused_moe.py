"""The fused MoE kernels (routing, align, grouped GEMMs; FP8 experts with a scale per row or per block) against their
plain-torch references, and TritonOps' MoE operators on them. Shapes stay small for the interpreter; H and I are no
powers of two where the kernels mask."""
import json

import pytest
import torch

from sluice.kernels import (fused_experts, fused_experts_ref, moe_align_block_size, moe_align_block_size_ref, moe_down,
                            moe_down_ref, moe_gate_up, moe_gate_up_ref, moe_launch_config, pair_blocks, topk_softmax,
                            topk_softmax_ref)
from sluice.kernels.fp8_quant import quantize_rows_fp8, quantize_rows_fp8_ref
from sluice.worker.models.moe import Experts
from sluice.worker.ops.fp8_gemm import fp8_gemm_for
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.ops.triton_kernels import TritonOps
from tests.scripts import ROOT, load_script
from tests.worker.fp8_checkpoints import quantize_blocks

# bf16: the reference adds the experts' outputs in bf16, the kernel in fp32; the interpreter truncates each rounding
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=4e-2, rtol=2e-2)}


def _distinct_logits(num_tokens: int, num_experts: int, device, dtype=torch.float32) -> torch.Tensor:
    """Router logits without ties within a row (multiples of 1/8, exact in bf16)."""
    ranks = torch.rand(num_tokens, num_experts).argsort(-1)  # a random permutation of the experts per token
    return ((ranks.float() - num_experts / 2) / 8).to(device=device, dtype=dtype)


def _routing(num_tokens: int, num_experts: int, top_k: int, device):
    """Each token's top_k distinct experts and renormalized float32 weights."""
    return topk_softmax_ref(_distinct_logits(num_tokens, num_experts, device), top_k, True)


def _experts(num_experts: int, hidden: int, intermediate: int, dtype, device):
    w13 = torch.randn(num_experts, 2 * intermediate, hidden, device=device) / hidden**0.5
    w2 = torch.randn(num_experts, hidden, intermediate, device=device) / intermediate**0.5
    return w13.to(dtype), w2.to(dtype)


# -- routing

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 37])
@pytest.mark.parametrize("num_experts,top_k", [(8, 1), (8, 2), (16, 8), (60, 4)])
@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_matches_reference(device, dtype, num_tokens, num_experts, top_k, renormalize):
    logits = _distinct_logits(num_tokens, num_experts, device, dtype)
    weights, ids = topk_softmax(logits, top_k, renormalize)
    expected_weights, expected_ids = topk_softmax_ref(logits, top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (num_tokens, top_k)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)


def test_routing_of_random_logits_and_strided_rows(device):
    """Logits without constructed gaps, read through a view with a row stride wider than the experts."""
    logits = torch.randn(37, 80, device=device)[:, :60]
    weights, ids = topk_softmax(logits, 8, True)
    expected_weights, expected_ids = topk_softmax_ref(logits, 8, True)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)


def test_routing_rejects_more_slots_than_experts(device):
    with pytest.raises(ValueError, match="top_k"):
        topk_softmax(torch.randn(4, 8, device=device), 9, True)


# -- align

def _assert_same_blocks(blocks, expected):
    num_padded = int(expected.num_padded)
    assert int(blocks.num_padded) == num_padded and num_padded % blocks.block_m == 0
    assert torch.equal(blocks.sorted_ids[:num_padded], expected.sorted_ids[:num_padded])
    in_use = num_padded // blocks.block_m
    assert torch.equal(blocks.block_experts[:in_use], expected.block_experts[:in_use])
    assert blocks.sorted_ids.shape == expected.sorted_ids.shape


@pytest.mark.parametrize("num_tokens,top_k,num_experts", [(1, 1, 8), (1, 8, 16), (5, 2, 16), (37, 8, 16),
                                                          (37, 4, 60)])
@pytest.mark.parametrize("chunk", [None, 16])  # 16: several chunks, the count kernel and the count table
@pytest.mark.parametrize("mapped", [False, True])
def test_align_matches_reference(device, num_tokens, top_k, num_experts, chunk, mapped):
    _, ids = _routing(num_tokens, num_experts, top_k, device)
    expert_map = None
    local_experts = num_experts
    if mapped:  # this rank holds every other expert, in reverse order
        local_experts = num_experts // 2
        expert_map = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
        expert_map[1::2] = torch.arange(local_experts - 1, -1, -1, dtype=torch.int32, device=device)
    blocks = moe_align_block_size(ids, local_experts, 16, expert_map, chunk=chunk)
    expected = moe_align_block_size_ref(ids, local_experts, 16, expert_map)
    _assert_same_blocks(blocks, expected)
    # every pair on this rank sits exactly once in its expert's block
    rows = blocks.sorted_ids[:int(blocks.num_padded)].long()
    routed = rows < ids.numel()
    local = ids.reshape(-1).long() if expert_map is None else expert_map.long()[ids.reshape(-1).long()]
    assert sorted(rows[routed].tolist()) == torch.nonzero(local >= 0).flatten().tolist()
    row_experts = blocks.block_experts.repeat_interleave(16)[:rows.numel()].long()
    assert torch.equal(row_experts[routed], local[rows[routed]])


def test_align_gives_idle_experts_no_block(device):
    ids = torch.tensor([[3, 0], [3, 0], [0, 3]], dtype=torch.int32, device=device)
    blocks = moe_align_block_size(ids, 16, 16)
    assert int(blocks.num_padded) == 32
    assert blocks.block_experts[:2].tolist() == [0, 3]
    assert blocks.sorted_ids[:32].tolist() == [1, 3, 4] + [6] * 13 + [0, 2, 5] + [6] * 13


def test_align_of_no_pairs(device):
    blocks = moe_align_block_size(torch.empty(0, 8, dtype=torch.int32, device=device), 16, 16)
    assert int(blocks.num_padded) == 0 and blocks.block_experts.numel() == 0


# -- the grouped GEMMs and the layer

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("one_pair_each", [False, True], ids=["sorted", "pair-blocks"])
def test_gate_up_and_down_match_their_references(device, dtype, one_pair_each):
    num_tokens, num_experts, top_k, hidden, intermediate = 5, 16, 8, 72, 40
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    w13, w2 = _experts(num_experts, hidden, intermediate, dtype, device)
    config = moe_launch_config(num_tokens, top_k, num_experts, hidden, intermediate, dtype, device)
    blocks = pair_blocks(ids, config["BLOCK_M"]) if one_pair_each else \
        moe_align_block_size(ids, num_experts, config["BLOCK_M"])
    h = moe_gate_up(x, w13, blocks, top_k, config)
    torch.testing.assert_close(h, moe_gate_up_ref(x, w13, blocks, top_k), **TOL[dtype])
    torch.testing.assert_close(moe_down(h, w2, weights, blocks, config), moe_down_ref(h, w2, weights, blocks),
                               **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,intermediate", [
    (1, 8, 2, 72, 40),  # a sparse step: each pair its own block
    (3, 64, 4, 72, 40),  # the same, over several tokens
    (5, 16, 8, 96, 80),
    (37, 16, 1, 72, 40),
    (37, 8, 2, 128, 64),  # K slices without a masked tail
    (5, 8, 8, 64, 48),  # every expert takes every token
])
def test_fused_experts_matches_reference(device, dtype, num_tokens, num_experts, top_k, hidden, intermediate):
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    w13, w2 = _experts(num_experts, hidden, intermediate, dtype, device)
    out = fused_experts(x, weights, ids, w13, w2)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, w13, w2), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,intermediate", [(1, 8, 2, 72, 40), (37, 8, 4, 96, 80)])
def test_biased_experts_with_the_clamped_swiglu_match_reference(device, dtype, num_tokens, num_experts, top_k, hidden,
                                                                 intermediate):
    """gpt-oss's experts (_gpt_oss_options): the clamp changes the result."""
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = (3 * torch.randn(num_tokens, hidden, device=device)).to(dtype)
    w13, w2 = _experts(num_experts, hidden, intermediate, dtype, device)
    gpt_oss = _gpt_oss_options(num_experts, hidden, intermediate, dtype, device)
    out = fused_experts(x, weights, ids, w13, w2, **gpt_oss)
    torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, w13, w2, **gpt_oss), **TOL[dtype])
    biases_alone = dict(gpt_oss, swiglu=None)
    assert not torch.allclose(out, fused_experts(x, weights, ids, w13, w2, **biases_alone), **TOL[dtype])


def _gpt_oss_options(num_experts: int, hidden: int, intermediate: int, dtype, device) -> dict:
    """gpt-oss's experts: biases on both products, and a limit low enough that the clamp cuts gate and up."""
    return dict(w13_bias=torch.randn(num_experts, 2 * intermediate, device=device).to(dtype),
                w2_bias=torch.randn(num_experts, hidden, device=device).to(dtype), swiglu=(1.702, 1.5))


def test_experts_without_tokens(device):
    """Five tokens routed to experts 2 and 13 of 16 only; a strided x (rows wider than the hidden size)."""
    x = torch.randn(5, 96, device=device)[:, :72]
    ids = torch.tensor([[2, 13], [13, 2], [2, 13], [2, 13], [13, 2]], dtype=torch.int32, device=device)
    weights = torch.rand(5, 2, device=device)
    w13, w2 = _experts(16, 72, 40, torch.float32, device)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2), fused_experts_ref(x, weights, ids, w13, w2),
                               **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_parallel_ranks_add_up_to_the_whole_layer(device, dtype):
    """16 experts on two ranks (rank 0 the even ones): each rank's output matches the reference over its experts,
    and the two sum to the single-rank layer."""
    num_tokens, num_experts, top_k, hidden, intermediate = 37, 16, 4, 72, 40
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    w13, w2 = _experts(num_experts, hidden, intermediate, dtype, device)
    outs = []
    for rank in range(2):
        expert_map = torch.full((num_experts,), -1, dtype=torch.int32, device=device)
        expert_map[rank::2] = torch.arange(num_experts // 2, dtype=torch.int32, device=device)
        out = fused_experts(x, weights, ids, w13[rank::2], w2[rank::2], expert_map)
        torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, w13[rank::2], w2[rank::2], expert_map),
                                   **TOL[dtype])
        outs.append(out.float())
    torch.testing.assert_close(outs[0] + outs[1], fused_experts_ref(x, weights, ids, w13, w2).float(), **TOL[dtype])


def test_all_experts_remote_gives_zeros(device):
    weights, ids = _routing(5, 8, 2, device)
    w13, w2 = _experts(2, 64, 48, torch.float32, device)
    expert_map = torch.full((8,), -1, dtype=torch.int32, device=device)
    out = fused_experts(torch.randn(5, 64, device=device), weights, ids, w13, w2, expert_map)
    assert torch.equal(out, torch.zeros_like(out))


def test_no_tokens(device):
    w13, w2 = _experts(8, 64, 48, torch.float32, device)
    out = fused_experts(torch.empty(0, 64, device=device), torch.empty(0, 2, device=device),
                        torch.empty(0, 2, dtype=torch.int32, device=device), w13, w2)
    assert out.shape == (0, 64)


def test_rejects_mismatched_experts(device):
    weights, ids = _routing(1, 8, 2, device)
    w13, w2 = _experts(8, 64, 48, torch.float32, device)
    with pytest.raises(ValueError, match="w13"):
        fused_experts(torch.randn(1, 64, device=device), weights, ids, w13, w2[:, :, :40])


def test_launch_config_follows_rows_per_expert():
    """On a GPU the block grows with the rows each expert gets (Qwen3-30B-A3B: 128 experts, top-8), and tiles stay
    within small shapes."""
    cuda = torch.device("cuda")
    block_m = [moe_launch_config(t, 8, 128, 2048, 768, torch.bfloat16, cuda)["BLOCK_M"] for t in (1, 64, 256, 4096)]
    assert block_m == [16, 16, 32, 128]
    small = moe_launch_config(4096, 8, 8, 48, 24, torch.bfloat16, cuda)
    assert small["BLOCK_N"] == 64 and small["BLOCK_K"] == 32  # gate and up halves of 32 cover I = 24


# -- FP8 experts

BLOCK_SHAPE = (16, 16)  # block-wise experts' blocks at the interpreter's sizes (Qwen's FP8 releases: 128 x 128)
SCALES = dict(argvalues=[None, BLOCK_SHAPE], ids=["rows", "blocks"])


def _fp8(weights: torch.Tensor, block_shape: tuple[int, int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked experts' weights [E, N, K] in e4m3 with float32 scales, [E, N] (one per row) or one per block."""
    if block_shape is None:
        values, scales = quantize_rows_fp8_ref(weights.flatten(0, 1))
        return values.view(weights.shape), scales.view(weights.shape[:2])
    values, scales = zip(*(quantize_blocks(expert, block_shape) for expert in weights))
    return torch.stack(values), torch.stack(scales)


def _fp8_experts(num_experts: int, hidden: int, intermediate: int, block_shape, device) -> tuple:
    """(w13, w2, w13_scale, w2_scale, the float32 weights they quantize)."""
    w13, w2 = _experts(num_experts, hidden, intermediate, torch.float32, device)
    (w13_q, w13_scale), (w2_q, w2_scale) = _fp8(w13, block_shape), _fp8(w2, block_shape)
    return w13_q, w2_q, w13_scale, w2_scale, (w13, w2)


@pytest.mark.parametrize("block_shape", **SCALES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,intermediate", [
    (1, 8, 2, 72, 32),  # H in cut blocks
    (37, 16, 4, 96, 48),
])
def test_fp8_experts_match_reference(device, block_shape, dtype, num_tokens, num_experts, top_k, hidden,
                                     intermediate):
    """e4m3 by e4m3, activations quantized per token (in groups of a block's columns for block-wise weights); the
    result stays near the unquantized experts'."""
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    w13, w2, w13_scale, w2_scale, unquantized = _fp8_experts(num_experts, hidden, intermediate, block_shape, device)
    out = fused_experts(x, weights, ids, w13, w2, None, w13_scale, w2_scale, block_shape)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, w13, w2, None, w13_scale, w2_scale,
                                                      block_shape), **TOL[dtype])
    exact = fused_experts_ref(x.float(), weights, ids, *unquantized)
    assert ((out.float() - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.1


@pytest.mark.parametrize("block_shape", **SCALES)
def test_fp8_experts_without_tokens_and_on_two_ranks(device, block_shape):
    """Five tokens routed to experts 2 and 13 of 16 only, then the odd experts on the second of two ranks."""
    x = torch.randn(5, 72, device=device)
    ids = torch.tensor([[2, 13], [13, 2], [2, 13], [2, 13], [13, 2]], dtype=torch.int32, device=device)
    weights = torch.rand(5, 2, device=device)
    w13, w2, w13_scale, w2_scale, _ = _fp8_experts(16, 72, 32, block_shape, device)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2, None, w13_scale, w2_scale, block_shape),
                               fused_experts_ref(x, weights, ids, w13, w2, None, w13_scale, w2_scale, block_shape),
                               **TOL[torch.float32])
    expert_map = torch.full((16,), -1, dtype=torch.int32, device=device)
    expert_map[1::2] = torch.arange(8, dtype=torch.int32, device=device)
    odd = (w13[1::2], w2[1::2], expert_map, w13_scale[1::2], w2_scale[1::2], block_shape)
    torch.testing.assert_close(fused_experts(x, weights, ids, *odd), fused_experts_ref(x, weights, ids, *odd),
                               **TOL[torch.float32])


def test_fp8_activations_are_clipped_at_an_absmax_bound(device):
    weights, ids = _routing(5, 8, 2, device)
    x = torch.randn(5, 64, device=device)
    w13, w2, w13_scale, w2_scale, _ = _fp8_experts(8, 64, 32, None, device)
    bound = x.abs().amax(-1).min().item() / 2
    fp8 = (w13, w2, None, w13_scale, w2_scale, None)
    out = fused_experts(x, weights, ids, *fp8, absmax_bound=bound)
    torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, *fp8, absmax_bound=bound),
                               **TOL[torch.float32])
    assert not torch.allclose(out, fused_experts(x, weights, ids, *fp8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens,num_experts,top_k,hidden,intermediate", [(1, 8, 2, 72, 32), (37, 16, 4, 96, 48)])
def test_fp8_biased_experts_with_the_clamped_swiglu_match_reference(device, dtype, num_tokens, num_experts, top_k,
                                                                     hidden, intermediate):
    """gpt-oss's experts in FP8 (`--quantization fp8`): each bias added to its product once the row's and the
    column's scales are applied, then the clamped SwiGLU; the result stays near the unquantized experts'."""
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, hidden, device=device).to(dtype)
    w13, w2, w13_scale, w2_scale, unquantized = _fp8_experts(num_experts, hidden, intermediate, None, device)
    gpt_oss = _gpt_oss_options(num_experts, hidden, intermediate, dtype, device)
    fp8 = (w13, w2, None, w13_scale, w2_scale)
    out = fused_experts(x, weights, ids, *fp8, **gpt_oss)
    torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, *fp8, **gpt_oss), **TOL[dtype])
    float_biases = {name: value.float() for name, value in gpt_oss.items() if name.endswith("bias")}
    exact = fused_experts_ref(x.float(), weights, ids, *unquantized, **float_biases, swiglu=gpt_oss["swiglu"])
    assert ((out.float() - exact).norm(dim=-1) / exact.norm(dim=-1)).max() < 0.1


def test_rejects_fp8_experts_without_fitting_scales(device):
    weights, ids = _routing(1, 8, 2, device)
    x = torch.randn(1, 64, device=device)
    w13, w2, w13_scale, w2_scale, _ = _fp8_experts(8, 64, 48, BLOCK_SHAPE, device)
    with pytest.raises(ValueError, match="both be e4m3 with scales"):
        fused_experts(x, weights, ids, w13, w2, None, w13_scale, None, BLOCK_SHAPE)
    with pytest.raises(ValueError, match=r"w13 .* float32 scale \(8, 6, 4\)"):
        fused_experts(x, weights, ids, w13, w2, None, w13_scale[:, :5], w2_scale, BLOCK_SHAPE)
    with pytest.raises(ValueError, match="halves of 48 rows are no whole FP8 blocks of 32"):
        fused_experts(x, weights, ids, w13, w2, None, w13_scale[:, :4], w2_scale[:, :2], (32, 16))


# -- the operators

def _experts_layer(w13: torch.Tensor, w2: torch.Tensor, *scales: torch.Tensor, block_shape=None,
                   biases: tuple[torch.Tensor, ...] = ()) -> Experts:
    """The worker's Experts module over stacked weights (and their scales, and their biases w13_bias, w2_bias)."""
    layer = Experts(w13.shape[0], w2.shape[2], w2.shape[1], bool(scales), block_shape, bias=bool(biases))
    tensors = dict(zip(("w13", "w2", "w13_scale", "w2_scale"), (w13, w2, *scales)))
    layer.load_state_dict(tensors | dict(zip(("w13_bias", "w2_bias"), biases)), assign=True)
    return layer


def test_triton_ops_route_and_run_the_experts(device):
    ops = TritonOps()
    num_tokens, num_experts, top_k, hidden, intermediate = 5, 16, 4, 72, 40
    logits = _distinct_logits(num_tokens, num_experts, device, torch.bfloat16)
    weights, ids = ops.route_tokens(logits, top_k, False)
    expected_weights, expected_ids = topk_softmax_ref(logits, top_k, False)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    x = torch.randn(num_tokens, hidden, device=device).to(torch.bfloat16)
    w13, w2 = _experts(num_experts, hidden, intermediate, torch.bfloat16, device)
    expert_map = torch.arange(num_experts, dtype=torch.int32, device=device) - 4  # experts 0-3 remote
    torch.testing.assert_close(ops.fused_experts(x, weights, ids, _experts_layer(w13[4:], w2[4:]), expert_map),
                               fused_experts_ref(x, weights, ids, w13[4:], w2[4:], expert_map), **TOL[torch.bfloat16])


@pytest.mark.parametrize("block_shape", **SCALES)
def test_triton_ops_run_fp8_experts_as_the_torch_ops_do(device, block_shape):
    """Against the worker's plain-torch operators (the FP8 GEMM's product, or block-wise operands dequantized and
    multiplied), under an expert map: experts 0-3 on another rank."""
    gemm = fp8_gemm_for(device, quantize_rows_fp8)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weights, ids = _routing(5, 16, 4, device)
    x = torch.randn(5, 72, device=device).to(dtype)
    w13, w2, w13_scale, w2_scale, _ = _fp8_experts(12, 72, 32, block_shape, device)
    layer = _experts_layer(w13, w2, w13_scale, w2_scale, block_shape=block_shape)
    expert_map = torch.arange(16, dtype=torch.int32, device=device) - 4
    torch.testing.assert_close(TritonOps(gemm).fused_experts(x, weights, ids, layer, expert_map),
                               TorchOps(gemm).fused_experts(x, weights, ids, layer, expert_map), **TOL[dtype])


@pytest.mark.parametrize("num_tokens", [1, 5])
def test_triton_ops_run_fp8_biased_experts_as_the_torch_ops_do(device, num_tokens):
    """gpt-oss's FP8 experts (ops.biased_experts): the fused kernels give what the plain-torch operators compute,
    each projection the FP8 GEMM's product plus its bias, then the clamped SwiGLU."""
    gemm = fp8_gemm_for(device, quantize_rows_fp8)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    weights, ids = _routing(num_tokens, 8, 2, device)
    x = torch.randn(num_tokens, 72, device=device).to(dtype)
    w13, w2, w13_scale, w2_scale, _ = _fp8_experts(8, 72, 32, None, device)
    gpt_oss = _gpt_oss_options(8, 72, 32, dtype, device)
    layer = _experts_layer(w13, w2, w13_scale, w2_scale, biases=(gpt_oss["w13_bias"], gpt_oss["w2_bias"]))
    alpha, limit = gpt_oss["swiglu"]
    torch.testing.assert_close(TritonOps(gemm).biased_experts(x, weights, ids, layer, alpha, limit),
                               TorchOps(gemm).biased_experts(x, weights, ids, layer, alpha, limit), **TOL[dtype])


# -- the benchmark

@pytest.mark.skipif(torch.cuda.is_available(), reason="--tiny is the interpreter's shape")
def test_benchmark_runs_its_tiny_shape(tmp_path):
    """benchmarks/fused_moe.py end to end on the CPU: its check against the reference passes."""
    benchmark = load_script(ROOT / "benchmarks" / "fused_moe.py")
    assert benchmark.main([str(tmp_path / "moe.json"), "--tiny"]) == 0
    rows = json.loads((tmp_path / "moe.json").read_text())["layer"]
    assert [row["tokens"] for row in rows] == [1, 5] and all(row["ok"] for row in rows)


# -- realistic shapes

@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 64, 256, 4096])
def test_realistic_qwen3_moe(device, num_tokens):
    """Qwen3-30B-A3B's experts: 128, top-8, H 2048, I 768, bf16."""
    logits = _distinct_logits(num_tokens, 128, device, torch.bfloat16)
    weights, ids = topk_softmax(logits, 8, True)
    expected_weights, expected_ids = topk_softmax_ref(logits, 8, True)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    x = torch.randn(num_tokens, 2048, device=device).to(torch.bfloat16)
    w13, w2 = _experts(128, 2048, 768, torch.bfloat16, device)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2), fused_experts_ref(x, weights, ids, w13, w2),
                               **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("block_shape", [None, (128, 128)], ids=["rows", "blocks"])
@pytest.mark.parametrize("num_tokens", [1, 256, 4096])
def test_realistic_qwen3_moe_fp8(device, block_shape, num_tokens):
    """Qwen3-30B-A3B's experts in FP8, bf16 activations: a scale per row (`--quantization fp8`), or per 128 x 128
    block (Qwen3-30B-A3B-FP8)."""
    weights, ids = topk_softmax(_distinct_logits(num_tokens, 128, device, torch.bfloat16), 8, True)
    x = torch.randn(num_tokens, 2048, device=device).to(torch.bfloat16)
    w13, w2, w13_scale, w2_scale, _ = _fp8_experts(128, 2048, 768, block_shape, device)
    fp8 = (w13, w2, None, w13_scale, w2_scale, block_shape)
    torch.testing.assert_close(fused_experts(x, weights, ids, *fp8), fused_experts_ref(x, weights, ids, *fp8),
                               **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 300])
def test_realistic_mixtral(device, num_tokens):
    """Mixtral-8x7B's experts: 8, top-2, H 4096, I 14336, bf16."""
    weights, ids = _routing(num_tokens, 8, 2, device)
    x = torch.randn(num_tokens, 4096, device=device).to(torch.bfloat16)
    w13, w2 = _experts(8, 4096, 14336, torch.bfloat16, device)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2), fused_experts_ref(x, weights, ids, w13, w2),
                               **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_realistic_align_of_a_prefill(device):
    """32,768 pairs of 128 experts: the count kernel and a 256-chunk table."""
    _, ids = _routing(4096, 128, 8, device)
    _assert_same_blocks(moe_align_block_size(ids, 128, 64), moe_align_block_size_ref(ids, 128, 64))
