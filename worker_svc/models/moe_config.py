"""MoeConfig: the mixture-of-experts layers of a decoder, read from a Hugging Face config.json as each family names
them."""
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ClampedSwiGLU:
    """gpt-oss's expert activation: (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)."""

    alpha: float
    limit: float


@dataclass(slots=True, frozen=True)
class MoeConfig:
    """Which layers route each token to top_k of num_experts experts (gated MLPs of intermediate_size), and how."""

    num_experts: int
    top_k: int
    intermediate_size: int  # one expert's
    renormalize: bool  # the top-k routing weights divided by their sum
    sparse_layers: tuple[int, ...]  # the layers with experts; the others keep the dense MLP
    shared_expert_intermediate_size: int = 0  # an expert every token runs, scaled by a sigmoid gate (Qwen2-MoE)
    clamped_swiglu: ClampedSwiGLU | None = None  # the experts' activation, where it is not silu(gate) * up

    def __post_init__(self):
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.top_k} must be in [1, num_experts {self.num_experts}]")


def _num_experts(hf: dict) -> int:
    """As published (Qwen and OLMoE: num_experts) or as transformers saves every family (num_local_experts)."""
    return hf["num_experts"] if "num_experts" in hf else hf["num_local_experts"]


def _qwen_moe(hf: dict) -> MoeConfig:
    """Qwen2-MoE and Qwen3-MoE: every decoder_sparse_step-th layer has experts, unless mlp_only_layers names it."""
    step, dense, num_experts = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or []), _num_experts(hf)
    sparse = tuple(layer for layer in range(hf["num_hidden_layers"])
                   if layer not in dense and num_experts > 0 and (layer + 1) % step == 0)
    return MoeConfig(num_experts, hf["num_experts_per_tok"], hf["moe_intermediate_size"],
                     hf.get("norm_topk_prob", False), sparse, hf.get("shared_expert_intermediate_size", 0))


def _every_layer(renormalize: Callable[[dict], bool]) -> Callable[[dict], MoeConfig]:
    """Mixtral and OLMoE: experts in every layer, each of the config's intermediate_size."""
    def read(hf: dict) -> MoeConfig:
        return MoeConfig(_num_experts(hf), hf["num_experts_per_tok"], hf["intermediate_size"], renormalize(hf),
                         tuple(range(hf["num_hidden_layers"])))
    return read


def _gpt_oss(hf: dict) -> MoeConfig:
    """gpt-oss: experts in every layer, their top-k router logits' softmax as weights, a clamped SwiGLU."""
    return MoeConfig(hf["num_local_experts"], hf["num_experts_per_tok"], hf["intermediate_size"], True,
                     tuple(range(hf["num_hidden_layers"])),
                     clamped_swiglu=ClampedSwiGLU(hf.get("swiglu_alpha", 1.702), hf.get("swiglu_limit", 7.0)))


MOE_READERS: dict[str, Callable[[dict], MoeConfig]] = {
    "Qwen2MoeForCausalLM": _qwen_moe,
    "Qwen3MoeForCausalLM": _qwen_moe,
    "MixtralForCausalLM": _every_layer(lambda hf: True),
    "OlmoeForCausalLM": _every_layer(lambda hf: hf.get("norm_topk_prob", False)),
    "GptOssForCausalLM": _gpt_oss,
}


def moe_config_from_hf(hf: dict) -> MoeConfig | None:
    """None for a dense architecture."""
    read = MOE_READERS.get(hf["architectures"][0])
    return None if read is None else read(hf)
