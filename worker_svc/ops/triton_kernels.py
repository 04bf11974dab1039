"""The operators on Triton kernels (TritonOps): the GPU path, TorchOps' interface with fused kernels."""
from typing import NamedTuple

import torch
from torch import nn

from sluice import kernels
from sluice.kernels.fp8_quant import quantize_rows_fp8
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.ops.fp8 import FP8
from sluice.worker.ops.fp8_gemm import Fp8Gemm, QuantizedRows, emulated_fp8_linear
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.ops.w4a16 import W4A16Linear, kernel_expert_weights


def _is_one_row(x: torch.Tensor) -> bool:
    return x.shape[0] == 1


def _weight_scale(layer: nn.Module) -> torch.Tensor | None:
    return layer.weight_scale if layer.weight.dtype == FP8 else None


def _quantizes_in_kernels(x: torch.Tensor, layer: nn.Module) -> bool:
    return layer.weight.dtype == FP8 and x.is_cuda


class UngatedRows(NamedTuple):
    """The MLP's [gate | up] projection rows, gated (activation(gate) * up) by the linear layer that reads them:
    straight into its e4m3 activations when that layer is FP8."""
    gate_up: torch.Tensor
    activation: str  # of kernels.activation


class TritonOps(TorchOps):
    """The GPU path: TorchOps' operator interface on the Triton kernels. Linear layers of one row (batch-1 decode)
    run as fused weight streams (kernels.fused_linear, which reads FP8 weights as they are stored); larger ones
    compose the norm and gate kernels around cuBLAS; around an FP8 GEMM on a GPU, the norm and the gate quantize the
    activations they produce themselves (on the CPU, Triton's interpreter rounds FP8 stores wrongly, 7.85 to 4, so
    torch quantizes them there)."""

    quantize_rows = staticmethod(quantize_rows_fp8)  # the FP8 GEMM's activations, as fp8.quantize_rows does

    def __init__(self, fp8_gemm: Fp8Gemm = emulated_fp8_linear, dependent_launch: bool = True):
        """dependent_launch: the decode path's kernels take programmatic dependent launch where the GPU has it."""
        super().__init__(fp8_gemm)
        self.pdl = dependent_launch

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_norm: bool = False) -> torch.Tensor:
        return kernels.rms_norm(x, weight, eps, gemma_norm)

    def add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     gemma_norm: bool = False):
        return kernels.fused_add_rms_norm(x, residual, weight, eps, gemma_norm)

    def linear(self, x: torch.Tensor | UngatedRows, layer: nn.Module) -> torch.Tensor:
        if isinstance(x, UngatedRows):
            if _quantizes_in_kernels(x.gate_up, layer):
                options = self.fp8_gemm.quantize_options(x.gate_up.shape[0])
                gated = kernels.act_and_mul_fp8(x.gate_up, x.activation, **options)
                return self._fp8_product(*gated, x.gate_up, layer)
            x = self.act_and_mul(x.gate_up, x.activation)
        if isinstance(layer, W4A16Linear):
            return kernels.w4a16_linear(x, layer.w4a16, layer.bias)
        if _is_one_row(x):
            return kernels.fused_linear(x, layer.weight, layer.bias, weight_scale=_weight_scale(layer), pdl=self.pdl)[0]
        return super().linear(x, layer)

    def norm_linear(self, x, residual, norm_weight, eps, layer, gated=False, out_dtype=None, gemma_norm=False,
                    activation="silu"):
        if isinstance(layer, W4A16Linear):  # the norm's kernels, then w4a16_linear's
            return super().norm_linear(x, residual, norm_weight, eps, layer, gated, out_dtype, gemma_norm, activation)
        if _is_one_row(x):
            y, new_residual = kernels.fused_linear(x, layer.weight, layer.bias, weight_scale=_weight_scale(layer),
                                                   norm_weight=norm_weight, eps=eps, residual=residual, gated=gated,
                                                   out_dtype=out_dtype, gemma_norm=gemma_norm, activation=activation,
                                                   pdl=self.pdl)
        elif _quantizes_in_kernels(x, layer):
            options = self.fp8_gemm.quantize_options(x.shape[0])
            values, scales, new_residual = kernels.rms_norm_fp8(x, residual, norm_weight, eps, **options,
                                                                gemma_norm=gemma_norm)
            y = self._fp8_product(values, scales, x, layer)
            if gated:
                y = UngatedRows(y, activation)
            elif out_dtype is not None:
                y = y.to(out_dtype)
        else:
            return super().norm_linear(x, residual, norm_weight, eps, layer, gated, out_dtype, gemma_norm, activation)
        return y, x if residual is None else new_residual

    def _fp8_product(self, values: torch.Tensor, scales: torch.Tensor, x: torch.Tensor, layer: nn.Module):
        """The layer's FP8 product of x's rows, which a kernel quantized to values and scales."""
        return self.fp8_gemm.product(QuantizedRows(values, scales, x.shape[0], x.dtype), layer.weight,
                                     layer.weight_scale, layer.bias)

    def prepare_qkv(self, qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, key_cache, value_cache,
                    slot_mapping, k_scale=None, v_scale=None, gemma_norm=False) -> torch.Tensor:
        return kernels.prepare_qkv(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, key_cache,
                                   value_cache, slot_mapping, k_scale, v_scale, gemma_norm, pdl=self.pdl)

    @staticmethod
    def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(x)

    @staticmethod
    def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
        return kernels.gelu_tanh_and_mul(x)

    def decode_step_inputs(self, next_positions, live, block_tables, positions, slot_mapping, seq_lens,
                           block_size: int) -> None:
        kernels.decode_step_inputs(next_positions, live, block_tables, positions, slot_mapping, seq_lens, block_size,
                                   pdl=self.pdl)

    def route_tokens(self, router_logits: torch.Tensor, top_k: int,
                     renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights float32 [T, k], topk_ids int32 [T, k]): softmax, top-k and renormalization in one kernel."""
        return kernels.topk_softmax(router_logits, top_k, renormalize, pdl=self.pdl)

    def fused_experts(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: nn.Module,
                      expert_map: torch.Tensor | None = None) -> torch.Tensor:
        """The routed experts' weighted sum [T, H]: the pairs sorted into per-expert blocks, then the gate/up GEMM
        (SiLU-and-mul fused) and the down GEMM (routing weight fused), one launch each for all experts. FP8 experts'
        activations are quantized per token (in groups of a block's columns for block-wise ones) under the FP8 GEMM's
        absmax bound; 4-bit experts are dequantized inside the GEMMs."""
        return self._experts(x, topk_weights, topk_ids, experts, expert_map)

    def biased_experts(self, x, topk_weights, topk_ids, experts: nn.Module, alpha: float,
                       limit: float) -> torch.Tensor:
        """gpt-oss's experts in the two fused MoE launches: biases added in each GEMM's epilogue (after an FP8
        product's scales), the clamped SwiGLU for the SiLU-and-mul."""
        return self._experts(x, topk_weights, topk_ids, experts, swiglu=(alpha, limit))

    def _experts(self, x, topk_weights, topk_ids, experts: nn.Module, expert_map: torch.Tensor | None = None,
                 swiglu: tuple[float, float] | None = None) -> torch.Tensor:
        return kernels.fused_experts(x, topk_weights, topk_ids, kernel_expert_weights(experts.w13),
                                     kernel_expert_weights(experts.w2), expert_map,
                                     experts.w13_scale, experts.w2_scale, experts.block_shape,
                                     self.fp8_gemm.absmax_bound, pdl=self.pdl, w13_bias=experts.w13_bias,
                                     w2_bias=experts.w2_bias, swiglu=swiglu)

    def attention(self, q, key_cache, value_cache, meta: AttentionMetadata, scale: float, k_scale=None, v_scale=None,
                  out=None, sliding_window: int = 0, softcap: float = 0.0, sinks=None) -> torch.Tensor:
        variant = dict(sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        if meta.is_pure_decode:
            return kernels.paged_decode_attention(q, key_cache, value_cache, meta.block_tables, meta.seq_lens, scale,
                                                  k_scale=k_scale, v_scale=v_scale, out=out,
                                                  row_groups=meta.row_groups, max_group_rows=meta.max_group_rows,
                                                  pdl=self.pdl, **variant)
        return kernels.paged_prefill_attention(q, key_cache, value_cache, meta.block_tables, meta.query_start_loc,
                                               meta.seq_lens, scale, k_scale, v_scale, out, **variant)
