import torch

import kernels
from worker_svc.models.attention_metadata import AttentionMetadata
from worker_svc.models.torch_ops import TorchOps


def _is_one_row(x: torch.Tensor) -> bool:
    return x.shape[0] == 1


class TritonOps(TorchOps):
    """The GPU path: TorchOps' operator interface on the Triton kernels. Linear layers of one row (batch-1 decode)
    run as fused weight streams (kernels.fused_linear); larger ones compose the norm and gate kernels around
    cuBLAS."""

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return kernels.rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
        return kernels.fused_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if _is_one_row(x):
            return kernels.fused_linear(x, weight, bias)[0]
        return TorchOps.linear(x, weight, bias)

    def norm_linear(self, x, residual, norm_weight, eps, weight, bias=None, gated=False, out_dtype=None):
        if not _is_one_row(x):
            return super().norm_linear(x, residual, norm_weight, eps, weight, bias, gated, out_dtype)
        y, new_residual = kernels.fused_linear(x, weight, bias, norm_weight=norm_weight, eps=eps, residual=residual,
                                               gated=gated, out_dtype=out_dtype)
        return y, x if residual is None else new_residual

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
