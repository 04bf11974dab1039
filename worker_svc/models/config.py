"""ModelConfig: the shape of a Llama-family decoder (dense or with mixture-of-experts layers), read from a Hugging Face
config.json."""
from dataclasses import dataclass

from sluice.worker.models.config_fields import check_config_fields, layer_windows, rope_type_of
from sluice.worker.models.moe_config import MoeConfig, moe_config_from_hf


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder, read from a Hugging Face config.json."""

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
    quantization: str | None = None  # "fp8": the decoder layers' projections hold e4m3 weights (ops/fp8.py)
    activation_absmax_bound: float | None = None  # fbgemm_fp8's activation_scale_ub (fp8.quantize_rows)
    expert_weight_block: tuple[int, int] | None = None  # FP8 experts' blocks (rows, columns); None: a scale a row
    moe: MoeConfig | None = None  # the mixture-of-experts layers, of an MoE architecture
    layer_windows: tuple[int, ...] = ()  # each layer's sliding window in tokens, 0 for full attention (() all full)
    partial_rotary_factor: float = 1.0  # the share of each head's leading dims that rotary rotates (Phi-4-mini: 0.75)

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    @classmethod
    def from_hf(cls, hf: dict) -> "ModelConfig":
        """Refuses an architecture, or a config field's value, that no model module computes (config_fields.py)."""
        check_config_fields(hf)
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope_type_of(rope)
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
            rope_theta=hf.get("rope_theta") or rope.get("rope_theta", 10000.0),
            rope_scaling=_rope_scaling(hf, rope, rope_type),
            max_position_embeddings=hf["max_position_embeddings"],
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
            moe=moe_config_from_hf(hf),
            layer_windows=layer_windows(hf),
            partial_rotary_factor=rope.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0,
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


def _rope_scaling(hf: dict, rope: dict, rope_type: str) -> dict | None:
    """The config's rope scaling (None for plain rope), with the pretraining context as transformers reads it: a
    top-level original_max_position_embeddings first (Phi-3 keeps it there), else the dict's, else the model's; and
    for YaRN and LongRoPE the factor, max_position_embeddings over that context where the dict gives none."""
    if rope_type == "default":
        return None
    scaling = dict(rope, rope_type=rope_type)
    scaling["original_max_position_embeddings"] = hf.get("original_max_position_embeddings") \
        or rope.get("original_max_position_embeddings") or hf["max_position_embeddings"]
    if rope_type in ("yarn", "longrope") and scaling.get("factor") is None:
        scaling["factor"] = hf["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    return scaling
