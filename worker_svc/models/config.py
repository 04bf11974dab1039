"""ModelConfig: the shape of a decoder (dense or with mixture-of-experts layers, or the language model of a
vision-language model, with its vision tower), read from a Hugging Face config.json."""
from dataclasses import dataclass

from sluice.worker.models.config_fields import (check_config_fields, language_model_fields, layer_ropes, layer_types,
                                                layer_windows, rope_type_of, vision_fields, with_defaults)
from sluice.worker.models.moe_config import MoeConfig, moe_config_from_hf
from sluice.worker.models.registry import traits_for
from sluice.worker.models.vision.config import VisionConfig

_DEFAULT_MROPE_SECTION = (16, 24, 24)  # transformers' Qwen2.5-VL, where the rope names none


@dataclass(slots=True, frozen=True)
class SlidingRope:
    """The rope of the sliding-window layers, where theirs is their own (Gemma 3)."""

    theta: float
    scaling: dict | None
    layers: tuple[int, ...]  # the layers of type sliding_attention (whether or not their window is dropped)


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape of a decoder, read from a Hugging Face config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]
    quantization: str | None = None  # "fp8": the decoder layers' projections hold e4m3 weights (ops/fp8.py); "awq",
    # "gptq", "compressed-tensors": a 4-bit checkpoint's, int4 where it stores them so (ops/w4a16.py)
    activation_absmax_bound: float | None = None  # fbgemm_fp8's activation_scale_ub (fp8.quantize_rows)
    expert_weight_block: tuple[int, int] | None = None  # FP8 experts' blocks (rows, columns); None: a scale a row
    moe: MoeConfig | None = None  # the mixture-of-experts layers, of an MoE architecture
    layer_windows: tuple[int, ...] = ()  # each layer's sliding window in tokens, 0 for full attention (() all full)
    partial_rotary_factor: float = 1.0  # the share of each head's leading dims that rotary rotates (Phi-4-mini: 0.75)
    sliding_rope: SlidingRope | None = None  # None: every layer's rope is rope_theta's and rope_scaling's
    attention_scale: float = 0.0  # what attention scores are scaled by: head_dim ** -0.5 where 0 (Gemma: its own)
    attention_softcap: float = 0.0  # attention scores become cap * tanh(score / cap); 0: not capped
    final_logit_softcap: float = 0.0  # the logits, likewise
    vision: VisionConfig | None = None  # a vision-language model's vision tower
    mrope_section: tuple[int, ...] = ()  # multimodal rope: the frequencies rotated by each of 3 positions (mrope.py)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.mrope_section and 2 * sum(self.mrope_section) != self.rotary_dim:
            raise ValueError(f"mrope_section {list(self.mrope_section)} does not divide the {self.rotary_dim // 2} "
                             "rotary frequencies of a head")
        if self.vision is not None and self.vision.out_hidden_size != self.hidden_size:
            raise ValueError(f"the vision tower's out_hidden_size {self.vision.out_hidden_size} is not the language "
                             f"model's hidden_size {self.hidden_size}")

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Refuses an architecture, or a config field's value, that no model module computes (config_fields.py). A
        vision-language model's shape is its language model's, with its vision tower."""
        check_config_fields(hf)
        traits = traits_for(hf["architectures"][0])
        vision = VisionConfig.from_hf(*vision_fields(hf)) if traits.vision else None
        hf = with_defaults(language_model_fields(hf))
        rope, sliding_rope = layer_ropes(hf)
        eos = hf.get("eos_token_id")
        return cls(
            architecture=hf["architectures"][0],
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
            rms_norm_eps=hf["rms_norm_eps"],
            rope_theta=_rope_theta(rope, hf),
            rope_scaling=_rope_scaling(hf, rope),
            max_position_embeddings=hf["max_position_embeddings"],
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            moe=moe_config_from_hf(hf),
            layer_windows=layer_windows(hf),
            partial_rotary_factor=hf.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0,
            sliding_rope=_sliding_rope(sliding_rope, hf),
            attention_scale=hf["query_pre_attn_scalar"] ** -0.5 if hf.get("query_pre_attn_scalar") else 0.0,
            attention_softcap=hf.get("attn_logit_softcapping") or 0.0,
            final_logit_softcap=hf.get("final_logit_softcapping") or 0.0,
            vision=vision,
            mrope_section=tuple(rope.get("mrope_section") or _DEFAULT_MROPE_SECTION) if traits.mrope else (),
        )

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head that rotary rotates: int(head_dim * partial_rotary_factor), as transformers."""
        return int(self.head_dim * self.partial_rotary_factor)

    def has_experts(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.sparse_layers

    @property
    def attention_window(self) -> int:
        """Tokens back from its newest that a query reads in any layer, when every layer has a sliding window; 0
        when a layer attends to the whole context."""
        return max(self.layer_windows) if self.layer_windows and all(self.layer_windows) else 0

    def sliding_window(self, layer: int) -> int:
        """The layer's sliding window in tokens; 0 for full attention."""
        return self.layer_windows[layer] if self.layer_windows else 0


def _rope_theta(rope: dict, hf: dict) -> float:
    return rope.get("rope_theta") or hf.get("rope_theta") or 10000.0


def _rope_scaling(hf: dict, rope: dict) -> dict | None:
    """The rope's scaling as rope.py takes it (None for plain rope), with the pretraining context as transformers
    reads it: a top-level original_max_position_embeddings first (Phi-3 keeps it there), else the dict's, else the
    model's; and for YaRN and LongRoPE the factor, max_position_embeddings over that context where the dict gives
    none."""
    rope_type = rope_type_of(rope)
    if rope_type == "default":
        return None
    scaling = dict(rope, rope_type=rope_type)
    scaling["original_max_position_embeddings"] = hf.get("original_max_position_embeddings") \
        or rope.get("original_max_position_embeddings") or hf["max_position_embeddings"]
    if rope_type in ("yarn", "longrope") and scaling.get("factor") is None:
        scaling["factor"] = hf["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    return scaling


def _sliding_rope(rope: dict | None, hf: dict) -> SlidingRope | None:
    if rope is None:
        return None
    layers = tuple(layer for layer, kind in enumerate(layer_types(hf)) if kind == "sliding_attention")
    return SlidingRope(_rope_theta(rope, hf), _rope_scaling(hf, rope), layers)
