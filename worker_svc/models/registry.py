"""The supported architectures, each with what sets it apart from plain Llama (ArchitectureTraits); the mixtures of
experts among them also say how their MoE layers are shaped (moe_config.py). A family with a module of its own (Gemma,
gpt-oss, Qwen2.5-VL) registers its decoder classes in families.py."""
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ArchitectureTraits:
    """What sets one architecture apart from plain Llama."""

    activation: str = "silu"  # the gated MLP's, as transformers names it (hidden_act, or hidden_activation)
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")  # each decoder layer's
    attention_softcapping: bool = False  # the attention reads attn_logit_softcapping (Gemma 2; Gemma 3's ignores it)
    qkv_bias: bool = False
    qk_norm: bool = False  # RMSNorm of each q and k head (Qwen3; Gemma 3, as Gemma's norms compute it)
    qk_projection_norm: bool = False  # RMSNorm of the whole q and k projections, across the heads (OLMoE)
    expert_prefix: str = "mlp"  # where a checkpoint's MoE layer is: its router `gate` and its `experts`
    expert_projections: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # an expert's, as named there
    o_bias: bool = False  # a biased o_proj (gpt-oss, whose q, k and v are biased too)
    attention_sinks: bool = False  # a learned logit per head in each attention softmax (gpt-oss: self_attn.sinks)
    stacked_experts: bool = False  # experts stored stacked, with biases, behind a biased router (gpt-oss)
    fused_checkpoint: bool = False  # the checkpoint publishes q/k/v as one qkv_proj, gate/up as one gate_up_proj
    rope_types: tuple[str, ...] = ("default", "llama3", "yarn")  # the rope_scaling types its transformers module takes
    partial_rotary: bool = False  # partial_rotary_factor: rotary embeddings of each head's leading dims only
    sliding_rope: bool = False  # the sliding-window layers rotate by a rope of their own (Gemma 3)
    vision: bool = False  # a vision tower (vision_config): its image embeddings replace placeholders' (Qwen2.5-VL)
    mrope: bool = False  # multimodal rope: mrope_section divides the frequencies among 3 positions (Qwen2.5-VL)
    # (a prefix of transformers' module names, the published checkpoints' spelling of it): weights load under either
    checkpoint_prefixes: tuple[tuple[str, str], ...] = ()


_GEMMA_NORMS = (*ArchitectureTraits().layer_norms, "pre_feedforward_layernorm", "post_feedforward_layernorm")

ARCHITECTURES: dict[str, ArchitectureTraits] = {
    "LlamaForCausalLM": ArchitectureTraits(),
    "MistralForCausalLM": ArchitectureTraits(),
    "Qwen2ForCausalLM": ArchitectureTraits(qkv_bias=True),
    "Qwen3ForCausalLM": ArchitectureTraits(qk_norm=True),
    "Qwen2MoeForCausalLM": ArchitectureTraits(qkv_bias=True),
    "Qwen3MoeForCausalLM": ArchitectureTraits(qk_norm=True),
    "MixtralForCausalLM": ArchitectureTraits(expert_prefix="block_sparse_moe", expert_projections=("w1", "w3", "w2")),
    "OlmoeForCausalLM": ArchitectureTraits(qk_projection_norm=True),
    "GptOssForCausalLM": ArchitectureTraits(qkv_bias=True, o_bias=True, attention_sinks=True, stacked_experts=True),
    "Phi3ForCausalLM": ArchitectureTraits(fused_checkpoint=True, rope_types=("default", "longrope"),
                                          partial_rotary=True),
    "Gemma2ForCausalLM": ArchitectureTraits(activation="gelu_pytorch_tanh", layer_norms=_GEMMA_NORMS,
                                            attention_softcapping=True, rope_types=("default", "linear")),
    "Gemma3ForCausalLM": ArchitectureTraits(activation="gelu_pytorch_tanh", layer_norms=_GEMMA_NORMS, qk_norm=True,
                                            rope_types=("default", "linear"), sliding_rope=True),
    "Qwen2_5_VLForConditionalGeneration": ArchitectureTraits(
        qkv_bias=True, rope_types=("default",), vision=True, mrope=True,
        checkpoint_prefixes=(("model.language_model.", "model."), ("model.visual.", "visual."))),
}


def traits_for(architecture: str) -> ArchitectureTraits:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(ARCHITECTURES)}") from None
