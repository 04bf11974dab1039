"""One implementation of the Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/2.5, Qwen3, Phi-3, and the
mixtures of experts Qwen2-MoE, Qwen3-MoE, Mixtral and OLMoE) over a paged KV cache; other families (gemma.py,
gpt_oss.py) subclass its modules.

Tokens of all sequences in a step are flattened into one batch: [num_tokens, hidden]. Operators come from an injected
`ops` object (plain torch on the CPU, Triton kernels on a GPU), so the same module code serves both paths.
"""
import torch
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.layers import MLP, RMSNorm, linear_layer
from sluice.worker.models.moe import SparseMoeBlock
from sluice.worker.models.registry import ArchitectureTraits
from sluice.worker.models.rope import build_cos_sin_cache
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.ops.fp8 import FP8


class Attention(nn.Module):
    gemma_norm = False  # its per-head q/k norms are Gemma's (the ops' gemma_norm)

    def __init__(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int):
        super().__init__()
        self.sliding_window = config.sliding_window(layer)
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = linear_layer(config, config.hidden_size, self.q_size + 2 * self.kv_size, traits.qkv_bias)
        self.o_proj = linear_layer(config, self.q_size, config.hidden_size, traits.o_bias)
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if traits.attention_sinks else None
        # the per-head q/k norms' weights, applied inside ops.prepare_qkv (modules for the checkpoint names), or the
        # norms of the whole q and k projections, applied before it
        self.per_head_norms, self.projection_norms = traits.qk_norm, traits.qk_projection_norm
        norm_sizes = (self.head_dim, self.head_dim) if traits.qk_norm else (self.q_size, self.kv_size)
        has_norms = traits.qk_norm or traits.qk_projection_norm
        self.q_norm, self.k_norm = (RMSNorm(size, config.rms_norm_eps, ops) if has_norms else None
                                    for size in norm_sizes)
        self.scale = config.attention_scale or self.head_dim**-0.5
        self.softcap = config.attention_softcap
        # float32 scalars an FP8 KV cache's keys and values are stored divided by (loading/kv_scales.py)
        self.register_buffer("k_scale", torch.ones(()))
        self.register_buffer("v_scale", torch.ones(()))
        self.ops = ops

    @property
    def qk_norms(self) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        """(q norm weight, k norm weight, eps) as prepare_qkv takes them: (None, None, 0.0) without per-head norms."""
        if not self.per_head_norms:
            return None, None, 0.0
        return self.q_norm.weight, self.k_norm.weight, self.q_norm.eps

    def forward(self, qkv, positions, cos_sin_cache, kv_cache, meta: AttentionMetadata):
        key_cache, value_cache = kv_cache
        kv_scales = (self.k_scale, self.v_scale) if key_cache.dtype == FP8 else (None, None)
        # q: [num_tokens, num_heads, head_dim], normed and rotated; k and v go to the cache
        q = self.ops.prepare_qkv(self.heads(qkv), positions, cos_sin_cache, *self.qk_norms, key_cache, value_cache,
                                 meta.slot_mapping, *kv_scales, gemma_norm=self.gemma_norm)
        out = self.ops.attention(q, key_cache, value_cache, meta, self.scale, *kv_scales,
                                 sliding_window=self.sliding_window, softcap=self.softcap, sinks=self.sinks)
        return self.ops.linear(out.reshape(-1, self.q_size), self.o_proj)

    def heads(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv_proj's output as [num_tokens, num_heads + 2 * num_kv_heads, head_dim] q, k and v heads, as
        prepare_qkv takes them: with the norms of whole projections applied (per-head norms are prepare_qkv's)."""
        if self.projection_norms:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            qkv = torch.cat([self._projection_norm(q, self.q_norm), self._projection_norm(k, self.k_norm), v], -1)
        return qkv.view(-1, self.num_heads + 2 * self.num_kv_heads, self.head_dim)

    def _projection_norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """The RMSNorm of a whole q or k projection: all of its heads."""
        return self.ops.rms_norm(x, norm.weight, norm.eps)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, self_attn: Attention, mlp: nn.Module, ops):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = mlp

    def forward(self, x, residual, positions, cos_sin_cache, kv_cache, meta):
        # x: the previous layer's output; residual: the stream it adds to (None before the first layer)
        qkv, residual = self.input_layernorm.project(x, residual, self.self_attn.qkv_proj)
        x = self.self_attn(qkv, positions, cos_sin_cache, kv_cache, meta)
        return self.mlp(self.post_attention_layernorm, x, residual)


class DecoderLM(nn.Module):
    """The whole model on one device. A tensor-parallel rank's part of it (tensor_parallel.py) builds its own
    embedding, attention and MLP modules through the _embedding, _attention and _mlp methods; another family
    (gemma.py) its own layers and norm through _layer and _norm."""

    takes_images = False  # a vision-language model (qwen2_5_vl.py) has a vision tower

    def __init__(self, config: ModelConfig, traits: ArchitectureTraits, ops):
        super().__init__()
        self.config = config
        self.embed_tokens = self._embedding(config)
        self.layers = nn.ModuleList(self._layer(config, traits, ops, layer) for layer in range(config.num_layers))
        self.norm = self._norm(config, ops)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids, positions, cos_sin_cache, kv_caches, meta: AttentionMetadata,
                logits_indices: torch.Tensor | None) -> torch.Tensor:
        """Float32 logits [num_logits, vocab] of the tokens at logits_indices (None: of every token)."""
        return self.logits(*self.hidden_states(input_ids, positions, cos_sin_cache, kv_caches, meta, logits_indices))

    def hidden_states(self, input_ids, positions, cos_sin_cache, kv_caches, meta: AttentionMetadata,
                      logits_indices: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last layer's output and residual [num_logits, hidden] at logits_indices (None: at every token)."""
        return self.hidden_states_from_embeddings(self.embed(input_ids), positions, cos_sin_cache, kv_caches, meta,
                                                  logits_indices)

    def hidden_states_from_embeddings(self, x: torch.Tensor, positions, cos_sin_cache, kv_caches,
                                      meta: AttentionMetadata,
                                      logits_indices: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden_states of the token embeddings x [num_tokens, hidden], however they were made (a vision-language
        model's hold image embeddings at its placeholder tokens)."""
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            x, residual = layer(x, residual, positions, cos_sin_cache, kv_cache, meta)
        if logits_indices is not None:
            x, residual = x[logits_indices], residual[logits_indices]
        return x, residual

    def logits(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden_states' rows."""
        return self.norm.project(x, residual, self.lm_head, out_dtype=torch.float32)[0]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    @property
    def dtype(self) -> torch.dtype:
        """The activations' (the embedding's)."""
        return self.embed_tokens.weight.dtype

    def cos_sin_cache(self, max_position: int) -> torch.Tensor:
        """The float32 cos/sin rows of positions 0..max_position - 1 that the forward pass takes as cos_sin_cache
        (rope.build_cos_sin_cache)."""
        config = self.config
        return build_cos_sin_cache(config.rotary_dim, max_position, config.rope_theta, config.rope_scaling,
                                   torch.float32)

    def _embedding(self, config: ModelConfig) -> nn.Embedding:
        return nn.Embedding(config.vocab_size, config.hidden_size)

    def _layer(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int) -> nn.Module:
        return DecoderLayer(config, self._attention(config, traits, ops, layer), self._mlp(config, layer, ops), ops)

    def _norm(self, config: ModelConfig, ops) -> RMSNorm:
        """The norm after the last layer."""
        return RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def _attention(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int) -> Attention:
        return Attention(config, traits, ops, layer)

    def _mlp(self, config: ModelConfig, layer: int, ops) -> nn.Module:
        """The layer's MLP: its mixture of experts in an MoE layer."""
        return SparseMoeBlock(config, ops) if config.has_experts(layer) else MLP(config, ops)
