"""Gemma 2 and Gemma 3 (text), over the Llama-family decoder's modules (decoder.py, tensor_parallel.py).

What Gemma does its own way: the embedding is scaled by sqrt(hidden_size), in the model dtype; every norm is Gemma's
RMSNorm, x * (1 + weight) in float32; a layer norms attention's output, and the MLP's input and output (GeGLU: the
tanh approximation of gelu); attention scores scale by query_pre_attn_scalar ** -0.5 (decoder.Attention reads it
from the config, as it does Gemma 2's soft-capping of them); the logits are soft-capped where the config says so.
Sliding-window layers alternate with global ones as layer_types say; in Gemma 3 they rotate by a rope of their own
(rope_local_base_freq), and q and k are normed per head.
"""
import torch
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.decoder import Attention, DecoderLM
from sluice.worker.models.layers import MLP, RMSNorm
from sluice.worker.models.registry import ArchitectureTraits
from sluice.worker.models.rope import build_cos_sin_cache
from sluice.worker.models.tensor_parallel import RowParallelAttention, RowParallelMLP, TensorParallelDecoderLM


class GemmaRMSNorm(RMSNorm):
    """x * (1 + weight), computed in float32 and rounded once."""

    gemma_norm = True


class GemmaMLP(MLP):
    """GeGLU: down(gelu_tanh(gate) * up)."""

    activation = "gelu_tanh"


class GemmaAttention(Attention):
    """Gemma 3's per-head q and k norms are Gemma's norms (prepare_qkv applies them)."""

    gemma_norm = True


class GemmaDecoderLayer(nn.Module):
    """Four norms: before and after attention, before and after the MLP. The rotary table holds a Gemma 3 model's
    sliding-window rope after its global one (GemmaLM.cos_sin_cache); a sliding-window layer reads that half."""

    def __init__(self, config: ModelConfig, self_attn: GemmaAttention, mlp: GemmaMLP, ops, layer: int):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm, self.pre_feedforward_layernorm, \
            self.post_feedforward_layernorm = (GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, ops)
                                               for _ in range(4))
        self.self_attn = self_attn
        self.mlp = mlp
        sliding_rope = config.sliding_rope is not None and layer in config.sliding_rope.layers
        self.rope_columns = slice(config.head_dim, 2 * config.head_dim) if sliding_rope else slice(0, config.head_dim)

    def forward(self, x, residual, positions, cos_sin_cache, kv_cache, meta):
        # x: the previous layer's output; residual: the stream it adds to (None before the first layer)
        qkv, residual = self.input_layernorm.project(x, residual, self.self_attn.qkv_proj)
        x = self.self_attn(qkv, positions, cos_sin_cache[:, self.rope_columns], kv_cache, meta)
        x, residual = self.mlp(self.pre_feedforward_layernorm, self.post_attention_layernorm(x)[0], residual)
        return self.post_feedforward_layernorm(x)[0], residual


class GemmaLM(DecoderLM):
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = super().embed(input_ids)
        # sqrt(hidden_size) rounded to the model dtype first, as transformers scales by a tensor of that dtype
        return x * torch.tensor(self.config.hidden_size**0.5).to(x.dtype).item()

    def logits(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden_states' rows, soft-capped in the model dtype."""
        logits, _ = self.norm.project(x, residual, self.lm_head)
        cap = self.config.final_logit_softcap
        return (torch.tanh(logits / cap) * cap if cap else logits).float()

    def cos_sin_cache(self, max_position: int) -> torch.Tensor:
        """[max_position, head_dim] cos/sin rows, or with a rope of the sliding-window layers' own, theirs beside
        them: [max_position, 2 * head_dim]."""
        table, rope = super().cos_sin_cache(max_position), self.config.sliding_rope
        if rope is None:
            return table
        sliding = build_cos_sin_cache(self.config.head_dim, max_position, rope.theta, rope.scaling, torch.float32)
        return torch.cat([table, sliding], dim=1)

    def _attention(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int) -> Attention:
        return GemmaAttention(config, traits, ops, layer)

    def _mlp(self, config: ModelConfig, layer: int, ops) -> nn.Module:
        return GemmaMLP(config, ops)

    def _layer(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int) -> nn.Module:
        return GemmaDecoderLayer(config, self._attention(config, traits, ops, layer), self._mlp(config, layer, ops),
                                 ops, layer)

    def _norm(self, config: ModelConfig, ops) -> RMSNorm:
        return GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, ops)


class RowParallelGemmaAttention(RowParallelAttention, GemmaAttention):
    """The rank's heads of Gemma's attention."""


class RowParallelGemmaMLP(RowParallelMLP, GemmaMLP):
    """The rank's intermediate columns of Gemma's MLP."""


class TensorParallelGemmaLM(TensorParallelDecoderLM, GemmaLM):
    def _attention(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int) -> Attention:
        return RowParallelGemmaAttention(config, traits, ops, layer, self.group)

    def _mlp(self, config: ModelConfig, layer: int, ops) -> nn.Module:
        return RowParallelGemmaMLP(config, ops, self.group)
