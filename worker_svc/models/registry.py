"""The supported architectures, each with what sets it apart from plain Llama (ArchitectureTraits)."""
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ArchitectureTraits:
    """What sets one Llama-family architecture apart from plain Llama."""

    qkv_bias: bool = False
    qk_norm: bool = False


ARCHITECTURES: dict[str, ArchitectureTraits] = {
    "LlamaForCausalLM": ArchitectureTraits(),
    "MistralForCausalLM": ArchitectureTraits(),
    "Qwen2ForCausalLM": ArchitectureTraits(qkv_bias=True),
    "Qwen3ForCausalLM": ArchitectureTraits(qk_norm=True),
}


def traits_for(architecture: str) -> ArchitectureTraits:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(ARCHITECTURES)}") from None
