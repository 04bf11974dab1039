"""Triton kernels of the worker's hot path; each launcher has a plain-torch `*_ref` twin with the same semantics.
The sampling kernels (seeded_uniform, candidate_draw, weighted_draw, threshold_search, logprob_stats, imported by
their modules' names) compute exactly what the worker's torch sampling path computes on the CPU, which their tests
hold them to.

The mixture-of-experts layer: topk_softmax routes the tokens, moe_align_block_size sorts the (token, expert) pairs
into per-expert blocks, and the grouped GEMMs moe_gate_up and moe_down run every expert in one launch each;
fused_experts composes the last three.

4-bit weights: kernels.w4a16_layout converts GPTQ, AWQ and compressed-tensors checkpoints into one W4A16Weight
layout, and w4a16_linear multiplies by it (a GEMM for many rows, a weight stream for a few).

In place: reshape_and_cache, rotary_embedding, decode_step_inputs, and prepare_qkv's cache write. Everything
else returns new tensors.
"""
from sluice.kernels.activation import act_and_mul, act_and_mul_fp8, act_and_mul_ref, gelu_tanh_and_mul, silu_and_mul
from sluice.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from sluice.kernels.decode_inputs import decode_step_inputs, decode_step_inputs_ref
from sluice.kernels.fused_linear import fused_linear, fused_linear_ref
from sluice.kernels.fused_moe import (fused_experts, fused_experts_ref, moe_down, moe_down_ref, moe_gate_up,
                                      moe_gate_up_ref, moe_launch_config)
from sluice.kernels.moe_align import ExpertBlocks, moe_align_block_size, moe_align_block_size_ref, pair_blocks
from sluice.kernels.moe_routing import topk_softmax, topk_softmax_ref
from sluice.kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from sluice.kernels.qkv_prepare import prepare_qkv, prepare_qkv_ref
from sluice.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
from sluice.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_fp8, rms_norm_ref
from sluice.kernels.rotary_embedding import rotary_embedding, rotary_embedding_ref
from sluice.kernels.w4a16 import w4a16_linear, w4a16_linear_ref
from sluice.kernels.w4a16_layout import W4A16Weight

__all__ = [
    "ExpertBlocks",
    "W4A16Weight",
    "act_and_mul",
    "act_and_mul_fp8",
    "act_and_mul_ref",
    "decode_step_inputs",
    "decode_step_inputs_ref",
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "fused_experts",
    "fused_experts_ref",
    "fused_linear",
    "fused_linear_ref",
    "gelu_tanh_and_mul",
    "moe_align_block_size",
    "moe_align_block_size_ref",
    "moe_down",
    "moe_down_ref",
    "moe_gate_up",
    "moe_gate_up_ref",
    "moe_launch_config",
    "pair_blocks",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "prepare_qkv",
    "prepare_qkv_ref",
    "reshape_and_cache",
    "reshape_and_cache_ref",
    "rms_norm",
    "rms_norm_fp8",
    "rms_norm_ref",
    "rotary_embedding",
    "rotary_embedding_ref",
    "silu_and_mul",
    "topk_softmax",
    "topk_softmax_ref",
    "w4a16_linear",
    "w4a16_linear_ref",
]
