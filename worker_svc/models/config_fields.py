"""Every Hugging Face config field of the supported architectures, as the worker takes it: read into the model's
shape, of no effect on inference, or required to hold a value the models compute (a bias, an activation, a layer type
or a rope type they do not implement is refused at start, naming the field). A vision-language config's language
model is its text_config (or the fields beside its vision_config), checked as a decoder's; its vision_config is
checked as the vision tower's."""
from collections.abc import Callable
from dataclasses import dataclass

from sluice.worker.models.registry import ARCHITECTURES, traits_for

HONOURED = frozenset({
    "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
    "tie_word_embeddings", "eos_token_id", "quantization_config", "num_experts", "num_local_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "sliding_window", "use_sliding_window", "max_window_layers",
    "query_pre_attn_scalar", "final_logit_softcapping", "rope_local_base_freq", "sliding_window_pattern",
    "swiglu_alpha", "swiglu_limit", "original_max_position_embeddings", "text_config", "vision_config",
    "image_token_id",
})
VISION_HONOURED = frozenset({
    "depth", "hidden_size", "intermediate_size", "num_heads", "in_channels", "spatial_merge_size", "window_size",
    "fullatt_block_indexes", "out_hidden_size",
})
NO_EFFECT = frozenset({  # training, bookkeeping and generation defaults: the computation does not read them
    "_name_or_path", "transformers_version", "model_type", "dtype", "torch_dtype", "use_cache", "initializer_range",
    "attention_dropout", "bos_token_id", "pad_token_id", "id2label", "label2id", "problem_type", "return_dict",
    "output_attentions", "output_hidden_states", "is_encoder_decoder", "chunk_size_feed_forward",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "pretraining_tp", "cache_implementation",
    "embd_pdrop", "resid_pdrop",
    "_sliding_window_pattern",  # transformers' record of sliding_window_pattern, which layer_types spells out
    # a vision-language model's processor's tokens, and videos': the worker takes images
    "video_token_id", "vision_start_token_id", "vision_end_token_id",
})
# a sub-config's architectures (null), and the spacing of a video's frames in time
VISION_NO_EFFECT = NO_EFFECT | {"architectures", "tokens_per_second"}
# Phi-3's first configs name LongRoPE "su"; Qwen2.5-VL's name default rope with an mrope_section "mrope"
_ROPE_TYPE_ALIASES = {"su": "longrope", "mrope": "default"}
_LAYER_TYPES = ("full_attention", "sliding_attention")
_DEFAULTED = ("tie_word_embeddings", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")
_ROPE_FIELDS = ("rope_parameters", "rope_theta", "rope_scaling", "rope_local_base_freq")
_VISION_LANGUAGE_FIELDS = ("model_type", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                           "vision_end_token_id", "vision_token_id")  # beside the language model's in a flat config


@dataclass(slots=True, frozen=True)
class Requirement:
    holds: Callable[[object, dict], bool]  # (the field's value, the whole config)
    supported: str  # what the models compute, for the message ({rope_types}: the architecture's)


def rope_type_of(rope: dict) -> str:
    """The rope type a config's rope_scaling or rope_parameters dict names, "default" where it names none."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    return _ROPE_TYPE_ALIASES.get(rope_type, rope_type)


def _rope(value, hf: dict) -> bool:
    """A rope, or transformers 5's ropes per layer type (Gemma 3), of the architecture's rope types, rotating whole
    heads unless the architecture rotates partial ones, by multimodal positions only where it takes them."""
    ropes = value.values() if value and set(value) <= set(_LAYER_TYPES) else [value or {}]
    traits = traits_for(hf["architectures"][0])
    return all(rope_type_of(rope) in traits.rope_types and _whole_heads_rotate(rope.get("partial_rotary_factor"), hf)
               and (traits.mrope or not _is_multimodal(rope)) for rope in ropes)


def _is_multimodal(rope: dict) -> bool:
    return "mrope_section" in rope or rope.get("type", rope.get("rope_type")) == "mrope"


def _whole_heads_rotate(value, hf: dict) -> bool:
    return value in (None, 1.0) or traits_for(hf["architectures"][0]).partial_rotary


def _attention_bias(value, hf: dict) -> bool:
    """Biased q, k, v and o projections where the architecture's module has them (gpt-oss), none elsewhere."""
    return bool(value) == traits_for(hf["architectures"][0]).o_bias


def _activation(value, hf: dict) -> bool:
    return value == ARCHITECTURES[hf["architectures"][0]].activation


def _attention_softcapping(value, hf: dict) -> bool:
    return value is None or ARCHITECTURES[hf["architectures"][0]].attention_softcapping


_ROPE_SUPPORTED = ("rope_type {rope_types} (partial_rotary_factor 1.0 unless the architecture rotates partial heads, "
                   "an mrope_section only where it takes multimodal positions)")
REQUIRED: dict[str, Requirement] = {
    "hidden_act": Requirement(_activation, "the family's activation (silu; gelu_pytorch_tanh for Gemma)"),
    "hidden_activation": Requirement(_activation, "the family's activation (gelu_pytorch_tanh for Gemma)"),
    "attention_bias": Requirement(_attention_bias, "false (biased attention projections), but true for "
                                                   "GptOssForCausalLM"),
    "mlp_bias": Requirement(lambda value, hf: not value, "false (biased MLP projections)"),
    "qkv_bias": Requirement(lambda value, hf: value is True, "true (Qwen2-MoE's biased q, k and v)"),
    "layer_types": Requirement(lambda value, hf: set(value or ()) <= set(_LAYER_TYPES),
                               f"layers of types {' and '.join(_LAYER_TYPES)}"),
    "clip_qkv": Requirement(lambda value, hf: value is None, "null (clipped q, k and v)"),
    "partial_rotary_factor": Requirement(_whole_heads_rotate, "1.0 (partial rotary embeddings)"),
    "rope_scaling": Requirement(_rope, _ROPE_SUPPORTED),
    "rope_parameters": Requirement(_rope, _ROPE_SUPPORTED),
    "attn_logit_softcapping": Requirement(_attention_softcapping,
                                          "null where transformers' attention ignores it (Gemma 3)"),
    "use_bidirectional_attention": Requirement(lambda value, hf: not value, "false (causal attention)"),
}
VISION_REQUIRED: dict[str, Requirement] = {
    "hidden_act": Requirement(lambda value, hf: value == "silu", "silu (the vision tower's gated MLP)"),
    "patch_size": Requirement(lambda value, hf: isinstance(value, int), "one whole number (square patches)"),
    "temporal_patch_size": Requirement(lambda value, hf: isinstance(value, int), "one whole number"),
    "rope_parameters": Requirement(lambda value, hf: (value or {}).get("rope_type", "axial") == "axial",
                                   "rope_type axial (the tower's 2-D rope)"),
}


def check_config_fields(hf: dict) -> None:
    """Raises ValueError naming the architecture, the first field whose value the models do not compute, and what
    they support; an architecture no module implements is refused with the supported list."""
    architecture = (hf.get("architectures") or ["(none)"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(ARCHITECTURES)}")
    _check(architecture, language_model_fields(hf), REQUIRED, "")
    if ARCHITECTURES[architecture].vision:
        _check(architecture, vision_fields(hf)[0], VISION_REQUIRED, "vision_config.")


def _check(architecture: str, fields: dict, requirements: dict[str, Requirement], prefix: str) -> None:
    rope_types = " or ".join(ARCHITECTURES[architecture].rope_types)
    for name, requirement in requirements.items():
        if name in fields and not requirement.holds(fields[name], fields):
            raise ValueError(f"{architecture}: config.json sets {prefix}{name} = {fields[name]!r}, which the worker "
                             f"does not implement; it supports {requirement.supported.format(rope_types=rope_types)}")


def language_model_fields(hf: dict) -> dict:
    """A vision-language config's language model as a decoder's config (any other config as it is): its text_config,
    or in a config without one the fields beside vision_config (transformers builds its text_config of them), under
    the model's architecture, and tie_word_embeddings as transformers reads it (the top level's, or text_config's)."""
    if not traits_for(hf["architectures"][0]).vision:
        return hf
    text = hf.get("text_config") or {name: value for name, value in hf.items() if name not in _VISION_LANGUAGE_FIELDS}
    tie = hf.get("tie_word_embeddings", False) or text.get("tie_word_embeddings", False)
    model_type = {} if "model_type" not in hf else {"model_type": _sub_config(hf["model_type"], "text_config")}
    return {**text, **model_type, "architectures": hf["architectures"], "tie_word_embeddings": tie}


def vision_fields(hf: dict) -> tuple[dict, int]:
    """(vision_config, image_token_id) of a vision-language config, with transformers' defaults of what it lacks."""
    if "model_type" not in hf:
        return hf["vision_config"], hf["image_token_id"]
    defaults = _transformers_config({"model_type": hf["model_type"]})
    return defaults.vision_config.to_dict() | hf.get("vision_config", {}), \
        hf.get("image_token_id", defaults.image_token_id)


def with_defaults(hf: dict) -> dict:
    """The config with the fields it lacks among those whose defaults differ between families (Gemma ties its
    embeddings, scales attention its own way, caps its logits), as transformers' config class of its model_type
    defaults them."""
    missing = [name for name in _DEFAULTED if name not in hf]
    if not missing or "model_type" not in hf:
        return hf
    config = _transformers_config(hf, ())
    return hf | {name: getattr(config, name) for name in missing if hasattr(config, name)}


def layer_windows(hf: dict) -> tuple[int, ...]:
    """Each layer's sliding window in tokens (0: full attention), as transformers reads the config: a window slides
    in the layers of type sliding_attention, in every layer where the config has no layer types (Mistral). A window no
    shorter than the model's context changes nothing and is dropped."""
    window = hf.get("sliding_window") or 0
    if hf.get("use_sliding_window") is False or window >= hf["max_position_embeddings"]:
        window = 0
    if not window:
        return ()
    kinds = layer_types(hf)
    if kinds is None:
        return (window,) * hf["num_hidden_layers"]
    return tuple(window if kind == "sliding_attention" else 0 for kind in kinds)


def layer_types(hf: dict) -> list[str] | None:
    """Each layer's attention type: the config's layer_types or, in a config without them, those its transformers
    config class makes (Qwen2's past max_window_layers, Gemma's from sliding_window_pattern); None where it makes
    none."""
    if hf.get("layer_types") or "model_type" not in hf:
        return hf.get("layer_types")
    return getattr(_transformers_config(hf), "layer_types", None)


def layer_ropes(hf: dict) -> tuple[dict, dict | None]:
    """The rope parameters (rope_theta, and the rope_type with its own fields) of the full-attention layers, and of the
    sliding-window layers where they have ropes of their own (Gemma 3), as transformers reads them: from
    rope_parameters (per layer type in Gemma 3's), or from transformers 4's rope_theta, rope_scaling (the global
    layers') and rope_local_base_freq (the sliding-window layers'), with transformers' defaults for the architectures
    whose sliding-window layers have a rope of their own."""
    if "rope_parameters" not in hf and "model_type" in hf and traits_for(hf["architectures"][0]).sliding_rope:
        config = _transformers_config(hf, _ROPE_FIELDS)  # standardized, with the defaults of the fields it lacks
        hf = {name: getattr(config, name) for name in _ROPE_FIELDS if hasattr(config, name)}
    rope = hf.get("rope_parameters")
    if rope is None:
        rope = {"rope_theta": hf.get("rope_theta", 10000.0), **(hf.get("rope_scaling") or {})}
        local_base = hf.get("rope_local_base_freq")
        return rope, None if local_base is None else {"rope_type": "default", "rope_theta": local_base}
    if set(rope) <= set(_LAYER_TYPES):
        return rope["full_attention"], rope.get("sliding_attention")
    return rope, None


def _sub_config(model_type: str, name: str) -> str:
    """The model_type of a config's sub-config (its text_config's, say)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    return CONFIG_MAPPING[model_type].sub_configs[name].model_type


def _transformers_config(hf: dict, fields: tuple[str, ...] | None = None):
    """The config as transformers' config class of its model_type reads it, or only the given fields of it (the others
    at the class's defaults, whose checks then cannot refuse what the worker serves: a head_dim of its own, say)."""
    from transformers import AutoConfig
    given = hf if fields is None else {name: hf[name] for name in ("model_type", *fields) if name in hf}
    return AutoConfig.for_model(**given)
