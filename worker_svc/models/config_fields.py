"""Every Hugging Face config field of the supported architectures, as the worker takes it: read into the model's
shape, of no effect on inference, or required to hold a value the models compute (a bias, an activation, a layer type
or a rope type they do not implement is refused at start, naming the field)."""
from collections.abc import Callable
from dataclasses import dataclass

from sluice.worker.models.registry import ARCHITECTURES, traits_for

HONOURED = frozenset({
    "architectures", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
    "tie_word_embeddings", "eos_token_id", "quantization_config", "num_experts", "num_local_experts",
    "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size", "norm_topk_prob",
    "decoder_sparse_step", "mlp_only_layers", "sliding_window", "use_sliding_window", "max_window_layers",
    "swiglu_alpha", "swiglu_limit", "original_max_position_embeddings",
})
NO_EFFECT = frozenset({  # training, bookkeeping and generation defaults: the computation does not read them
    "_name_or_path", "transformers_version", "model_type", "dtype", "torch_dtype", "use_cache", "initializer_range",
    "attention_dropout", "bos_token_id", "pad_token_id", "id2label", "label2id", "problem_type", "return_dict",
    "output_attentions", "output_hidden_states", "is_encoder_decoder", "chunk_size_feed_forward",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "pretraining_tp", "embd_pdrop",
    "resid_pdrop",
})
_ROPE_TYPE_ALIASES = {"su": "longrope"}  # Phi-3's first configs name LongRoPE "su"
_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(slots=True, frozen=True)
class Requirement:
    holds: Callable[[object, dict], bool]  # (the field's value, the whole config)
    supported: str  # what the models compute, for the message ({rope_types}: the architecture's)


def rope_type_of(rope: dict) -> str:
    """The rope type a config's rope_scaling or rope_parameters dict names, "default" where it names none."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    return _ROPE_TYPE_ALIASES.get(rope_type, rope_type)


def _attention_bias(value, hf: dict) -> bool:
    """Biased q, k, v and o projections where the architecture's module has them (gpt-oss), none elsewhere."""
    return bool(value) == traits_for(hf["architectures"][0]).o_bias


def _whole_heads_rotate(value, hf: dict) -> bool:
    return value in (None, 1.0) or traits_for(hf["architectures"][0]).partial_rotary


def _rope(value, hf: dict) -> bool:
    return value is None or (rope_type_of(value) in traits_for(hf["architectures"][0]).rope_types
                             and _whole_heads_rotate(value.get("partial_rotary_factor"), hf))


_ROPE_SUPPORTED = "rope_type {rope_types} (partial_rotary_factor 1.0 unless the architecture rotates partial heads)"
REQUIRED: dict[str, Requirement] = {
    "hidden_act": Requirement(lambda value, hf: value == "silu", "silu"),
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
}


def check_config_fields(hf: dict) -> None:
    """Raises ValueError naming the architecture, the first field whose value the models do not compute, and what
    they support; an architecture no module implements is refused with the supported list."""
    architecture = (hf.get("architectures") or ["(none)"])[0]
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(ARCHITECTURES)}")
    rope_types = " or ".join(ARCHITECTURES[architecture].rope_types)
    for name, requirement in REQUIRED.items():
        if name in hf and not requirement.holds(hf[name], hf):
            raise ValueError(f"{architecture}: config.json sets {name} = {hf[name]!r}, which the worker does not "
                             f"implement; it supports {requirement.supported.format(rope_types=rope_types)}")


def layer_windows(hf: dict) -> tuple[int, ...]:
    """Each layer's sliding window in tokens (0: full attention), as transformers reads the config: a window slides
    in the layers that layer_types names sliding_attention or, in a config without them, in the layers that its
    transformers config class makes sliding (Qwen2's max_window_layers), every layer where it makes none (Mistral).
    A window no shorter than the model's context changes nothing and is dropped."""
    window = hf.get("sliding_window") or 0
    if hf.get("use_sliding_window") is False or window >= hf["max_position_embeddings"]:
        window = 0
    if not window:
        return ()
    kinds = hf.get("layer_types") or _transformers_layer_types(hf)
    if kinds is None:
        return (window,) * hf["num_hidden_layers"]
    return tuple(window if kind == "sliding_attention" else 0 for kind in kinds)


def _transformers_layer_types(hf: dict) -> list[str] | None:
    if "model_type" not in hf:
        return None
    from transformers import AutoConfig
    config = AutoConfig.for_model(**hf)
    return getattr(config, "layer_types", None)
