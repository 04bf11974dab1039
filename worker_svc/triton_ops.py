import torch

import kernels
from worker_svc.attention_metadata import AttentionMetadata


class TritonOps:
    """The GPU path: the same operator interface as TorchOps, on the Triton kernels."""

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return kernels.rms_norm(x, weight, eps)

    @staticmethod
    def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        return kernels.fused_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def prepare_qkv(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, key_cache, value_cache,
                    slot_mapping) -> torch.Tensor:
        return kernels.prepare_qkv(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, key_cache,
                                   value_cache, slot_mapping)

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(x)

    @staticmethod
    def attention(q, key_cache, value_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if meta.is_pure_decode:
            return kernels.paged_decode_attention(q, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale)
        return kernels.paged_prefill_attention(q, key_cache, value_cache, meta.block_tables, meta.query_start_loc,
                                               meta.seq_lens, scale)
