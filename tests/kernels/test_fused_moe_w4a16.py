"""The fused MoE kernels over 4-bit experts (kernels.w4a16_layout.W4A16Stack, dequantized in registers inside the
grouped GEMMs) against their reference (each expert dequantized, then fused_experts_ref): group sizes 32, 64 and 128,
zero points on and off, act-order permutations (each expert its own) and a tensor-parallel rank's share of act-order
down projections (each row naming its group), odd token counts, top-2 and top-8, and a rank's share of the experts."""
import json

import pytest
import torch

from sluice.kernels import fused_experts, fused_experts_ref, topk_softmax_ref
from sluice.kernels.w4a16_layout import W4A16Stack, W4A16Weight, dequantize_stack, input_run, quantize, stack
from tests.scripts import ROOT, load_script

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=4e-2, rtol=2e-2)}


def _routing(num_tokens: int, num_experts: int, top_k: int, device):
    logits = torch.rand(num_tokens, num_experts).argsort(-1).float().to(device) / 8  # no ties within a row
    return topk_softmax_ref(logits, top_k, True)


def _stacked(num_experts: int, rows: int, columns: int, group: int, zeros: bool, dtype, device,
             act_order: bool = False) -> W4A16Stack:
    """Random experts' weights [E, rows, columns] rounded to 4 bits, each expert on its own; with act_order each
    layout row holds a random input (a weight of its own, rows still sorted by group)."""
    weights = torch.randn(num_experts, rows, columns, device=device) / columns**0.5
    quantized = [quantize(weight.to(dtype), group, sym=not zeros) for weight in weights]
    if act_order:
        quantized = [W4A16Weight(w.qweight, w.scales, w.zeros, torch.randperm(columns, device=device).int())
                     for w in quantized]
    return stack(quantized)


def _experts(num_experts: int, hidden: int, intermediate: int, group: int, zeros: bool, dtype, device,
             act_order: bool = False):
    return (_stacked(num_experts, 2 * intermediate, hidden, group, zeros, dtype, device, act_order),
            _stacked(num_experts, hidden, intermediate, group, zeros, dtype, device, act_order))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zeros", [False, True], ids=["symmetric", "zero-points"])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 8, 2), (5, 16, 8), (37, 8, 2)])
def test_4bit_experts_match_reference(device, group, zeros, num_tokens, num_experts, top_k):
    w13, w2 = _experts(num_experts, 128, 128, group, zeros, torch.float32, device)
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, 128, device=device)
    out = fused_experts(x, weights, ids, w13, w2)
    torch.testing.assert_close(out, fused_experts_ref(x, weights, ids, w13, w2), **TOL[torch.float32])
    dense = fused_experts(x, weights, ids, dequantize_stack(w13), dequantize_stack(w2))
    torch.testing.assert_close(out, dense, **TOL[torch.float32])


@pytest.mark.parametrize("num_tokens", [3, 37])
def test_4bit_experts_in_bfloat16(device, num_tokens):
    """hidden 96 (three groups of 32), intermediate 64: no powers of two where the tiles are."""
    w13, w2 = _experts(8, 96, 64, 32, True, torch.bfloat16, device)
    weights, ids = _routing(num_tokens, 8, 2, device)
    x = torch.randn(num_tokens, 96, device=device, dtype=torch.bfloat16)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2).float(),
                               fused_experts_ref(x, weights, ids, w13, w2).float(), **TOL[torch.bfloat16])


def _rank_share(weights: W4A16Stack, rank: int) -> W4A16Stack:
    return W4A16Stack(*(None if t is None else t[rank::2].contiguous()
                        for t in (weights.qweight, weights.scales, weights.zeros)))


def test_expert_parallel_ranks_add_up_to_the_whole_layer(device):
    w13, w2 = _experts(8, 64, 64, 32, True, torch.float32, device)
    weights, ids = _routing(9, 8, 2, device)
    x = torch.randn(9, 64, device=device)
    outs = []
    for rank in range(2):
        expert_map = torch.full((8,), -1, dtype=torch.int32, device=device)
        expert_map[rank::2] = torch.arange(4, dtype=torch.int32, device=device)
        outs.append(fused_experts(x, weights, ids, _rank_share(w13, rank), _rank_share(w2, rank), expert_map))
    torch.testing.assert_close(outs[0] + outs[1], fused_experts_ref(x, weights, ids, w13, w2), **TOL[torch.float32])


def test_rejects_4bit_and_unquantized_experts_together(device):
    w13, w2 = _experts(8, 64, 64, 32, False, torch.float32, device)
    weights, ids = _routing(1, 8, 2, device)
    with pytest.raises(ValueError, match="both be 4-bit stacks"):
        fused_experts(torch.randn(1, 64, device=device), weights, ids, w13, dequantize_stack(w2))


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 8, 2), (37, 16, 8)])
def test_act_order_experts_match_reference(device, group, num_tokens, num_experts, top_k):
    w13, w2 = _experts(num_experts, 128, 128, group, True, torch.float32, device, act_order=True)
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, 128, device=device)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2), fused_experts_ref(x, weights, ids, w13, w2),
                               **TOL[torch.float32])


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zeros", [False, True], ids=["symmetric", "zero-points"])
@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 8, 2), (7, 8, 2)])  # a block each pair, sorted blocks
def test_a_ranks_share_of_act_order_experts_matches_reference(device, group, zeros, num_tokens, num_experts, top_k):
    """Rank 1 of 2 holds each expert's intermediate columns 128-255 of 256: gate and up rows sorted by group (a
    permutation), and down's inputs in their own order, each row naming its group among all 256 inputs'."""
    w13 = _stacked(num_experts, 2 * 128, 128, group, zeros, torch.float32, device, act_order=True)
    whole_w2 = _stacked(num_experts, 128, 256, group, zeros, torch.float32, device, act_order=True)
    w2 = stack([input_run(whole_w2.expert(e), 128, 256) for e in range(num_experts)])
    weights, ids = _routing(num_tokens, num_experts, top_k, device)
    x = torch.randn(num_tokens, 128, device=device)
    torch.testing.assert_close(fused_experts(x, weights, ids, w13, w2), fused_experts_ref(x, weights, ids, w13, w2),
                               **TOL[torch.float32])


def test_benchmark_runs_its_tiny_shape_in_4_bits(tmp_path):
    """benchmarks/fused_moe.py --w4a16 end to end on the CPU: its check against the reference passes."""
    benchmark = load_script(ROOT / "benchmarks" / "fused_moe.py")
    assert benchmark.main([str(tmp_path / "moe.json"), "--tiny", "--w4a16"]) == 0
    rows = json.loads((tmp_path / "moe.json").read_text())["layer"]
    assert [row["tokens"] for row in rows] == [1, 5] and all(row["ok"] for row in rows)
