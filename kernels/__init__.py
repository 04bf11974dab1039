"""Triton kernels of the worker's hot path; each launcher has a plain-torch `*_ref` twin with the same semantics.
The sampling kernels (seeded_uniform, candidate_draw, weighted_draw, threshold_search, logprob_stats, imported by
their modules' names) compute exactly what the worker's torch sampling path computes on the CPU, which their tests
hold them to.

In place: reshape_and_cache, rotary_embedding, decode_step_inputs, and prepare_qkv's cache write. Everything
else returns new tensors.
"""
from sluice.kernels.activation import silu_and_mul, silu_and_mul_fp8, silu_and_mul_ref
from sluice.kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref
from sluice.kernels.decode_inputs import decode_step_inputs, decode_step_inputs_ref
from sluice.kernels.fused_linear import fused_linear, fused_linear_ref
from sluice.kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from sluice.kernels.qkv_prepare import prepare_qkv, prepare_qkv_ref
from sluice.kernels.reshape_and_cache import reshape_and_cache, reshape_and_cache_ref
from sluice.kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_fp8, rms_norm_ref
from sluice.kernels.rotary_embedding import rotary_embedding, rotary_embedding_ref

__all__ = [
    "decode_step_inputs",
    "decode_step_inputs_ref",
    "fused_add_rms_norm",
    "fused_add_rms_norm_ref",
    "fused_linear",
    "fused_linear_ref",
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
    "silu_and_mul_fp8",
    "silu_and_mul_ref",
]
