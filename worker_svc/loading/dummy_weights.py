"""Random weights of a named shape, in Hugging Face layout, so the same tensors can also feed transformers."""
import re

import torch

from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.stacked_experts import stacked_expert_shapes
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.registry import ArchitectureTraits, traits_for
from sluice.worker.models.shard_layout import ShardLayout
from sluice.worker.models.vision.config import VisionConfig

INIT_STD = 0.02
_NORM = re.compile(r"(norm\d?|ln_q)\.weight$")  # the decoder's norms, and a vision tower's (norm1, norm2, ln_q)


def dummy_checkpoint(shape: str, dtype: torch.dtype, device: torch.device, seed: int = 0, rank: int = 0,
                     world_size: int = 1, expert_parallel: bool = False) -> tuple[dict, dict[str, torch.Tensor]]:
    """(hf_config, hf_state_dict) of random weights of a named shape: tensor-parallel rank `rank`'s shards of them."""
    hf_config = shape_config(shape)
    layout = ShardLayout(ModelConfig.from_hf(hf_config), rank, world_size, expert_parallel)
    return hf_config, random_state_dict(hf_config, dtype, device, seed, layout)


def random_state_dict(hf_config: dict, dtype: torch.dtype, device: torch.device, seed: int,
                      layout: ShardLayout | None = None) -> dict[str, torch.Tensor]:
    """Hugging Face-named random weights: norms = 1, everything else ~ N(0, INIT_STD). With a layout, each tensor is
    drawn whole (every world size gets the same weights) and only the rank's shard of it is kept."""
    generator = torch.Generator(device=device).manual_seed(seed)
    config = ModelConfig.from_hf(hf_config)
    layout = layout or ShardLayout(config)
    state = {}
    for name, size in _hf_parameter_shapes(config).items():
        tensor = torch.ones(size, dtype=dtype, device=device) if _NORM.search(name) else \
            torch.empty(size, dtype=dtype, device=device).normal_(0.0, INIT_STD, generator=generator)
        if layout.holds(name):
            state[name] = layout.shard(name, tensor)
    return state


def _hf_parameter_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    traits = traits_for(config.architecture)
    hidden, head_dim = config.hidden_size, config.head_dim
    q_size, kv_size = config.num_heads * head_dim, config.num_kv_heads * head_dim
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden), "model.norm.weight": (hidden,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    if config.vision is not None:
        shapes |= _vision_shapes(config.vision)
    for layer in range(config.num_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            **_qkv_shapes(config, traits, f"{p}self_attn."),
            f"{p}self_attn.o_proj.weight": (hidden, q_size),
            **_layer_mlp_shapes(config, traits, layer, p),
            **{f"{p}{norm}.weight": (hidden,) for norm in traits.layer_norms},
        }
        if traits.qkv_bias:
            shapes |= {f"{p}self_attn.q_proj.bias": (q_size,), f"{p}self_attn.k_proj.bias": (kv_size,),
                       f"{p}self_attn.v_proj.bias": (kv_size,)}
        if traits.o_bias:
            shapes[f"{p}self_attn.o_proj.bias"] = (hidden,)
        if traits.attention_sinks:
            shapes[f"{p}self_attn.sinks"] = (config.num_heads,)
        if traits.qk_norm:
            shapes |= {f"{p}self_attn.q_norm.weight": (head_dim,), f"{p}self_attn.k_norm.weight": (head_dim,)}
        if traits.qk_projection_norm:
            shapes |= {f"{p}self_attn.q_norm.weight": (q_size,), f"{p}self_attn.k_norm.weight": (kv_size,)}
    return shapes


def _qkv_shapes(config: ModelConfig, traits: ArchitectureTraits, prefix: str) -> dict:
    hidden, head_dim = config.hidden_size, config.head_dim
    q_size, kv_size = config.num_heads * head_dim, config.num_kv_heads * head_dim
    if traits.fused_checkpoint:
        return {f"{prefix}qkv_proj.weight": (q_size + 2 * kv_size, hidden)}
    return {f"{prefix}q_proj.weight": (q_size, hidden), f"{prefix}k_proj.weight": (kv_size, hidden),
            f"{prefix}v_proj.weight": (kv_size, hidden)}


def _layer_mlp_shapes(config: ModelConfig, traits: ArchitectureTraits, layer: int, prefix: str) -> dict:
    if not config.has_experts(layer):
        return _mlp_shapes(config, f"{prefix}mlp.", fused=traits.fused_checkpoint)
    return stacked_expert_shapes(config, prefix) if traits.stacked_experts else _moe_shapes(config, traits, prefix)


def _mlp_shapes(config: ModelConfig, prefix: str, intermediate_size: int | None = None,
                projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"), fused: bool = False) -> dict:
    hidden, intermediate = config.hidden_size, intermediate_size or config.intermediate_size
    gate, up, down = projections
    gate_up = {f"{prefix}gate_up_proj.weight": (2 * intermediate, hidden)} if fused else \
        {f"{prefix}{gate}.weight": (intermediate, hidden), f"{prefix}{up}.weight": (intermediate, hidden)}
    return {**gate_up, f"{prefix}{down}.weight": (hidden, intermediate)}


def _moe_shapes(config: ModelConfig, traits: ArchitectureTraits, layer_prefix: str) -> dict:
    moe, prefix = config.moe, f"{layer_prefix}{traits.expert_prefix}."
    shapes = {f"{prefix}gate.weight": (moe.num_experts, config.hidden_size)}
    for expert in range(moe.num_experts):
        shapes |= _mlp_shapes(config, f"{prefix}experts.{expert}.", moe.intermediate_size, traits.expert_projections)
    if moe.shared_expert_intermediate_size:
        shapes |= _mlp_shapes(config, f"{prefix}shared_expert.", moe.shared_expert_intermediate_size)
        shapes[f"{prefix}shared_expert_gate.weight"] = (1, config.hidden_size)
    return shapes


def _vision_shapes(vision: VisionConfig) -> dict:
    hidden, intermediate, merged = vision.hidden_size, vision.intermediate_size, vision.hidden_size * vision.merge_unit
    kernel = (vision.temporal_patch_size, vision.patch_size, vision.patch_size)
    shapes = {"visual.patch_embed.proj.weight": (hidden, vision.in_channels, *kernel),
              "visual.merger.ln_q.weight": (hidden,), "visual.merger.mlp.0.weight": (merged, merged),
              "visual.merger.mlp.0.bias": (merged,), "visual.merger.mlp.2.weight": (vision.out_hidden_size, merged),
              "visual.merger.mlp.2.bias": (vision.out_hidden_size,)}
    for block in range(vision.depth):
        p = f"visual.blocks.{block}."
        shapes |= {f"{p}norm1.weight": (hidden,), f"{p}norm2.weight": (hidden,),
                   f"{p}attn.qkv.weight": (3 * hidden, hidden), f"{p}attn.qkv.bias": (3 * hidden,),
                   f"{p}attn.proj.weight": (hidden, hidden), f"{p}attn.proj.bias": (hidden,),
                   **{f"{p}mlp.{name}.weight": (intermediate, hidden) for name in ("gate_proj", "up_proj")},
                   **{f"{p}mlp.{name}.bias": (intermediate,) for name in ("gate_proj", "up_proj")},
                   f"{p}mlp.down_proj.weight": (hidden, intermediate), f"{p}mlp.down_proj.bias": (hidden,)}
    return shapes
