"""Weights from a Hugging Face folder (config.json + safetensors) or a GGUF file, renamed to the worker's layout."""
import json
from pathlib import Path

import torch

from worker_svc.models.model_config import ModelConfig

_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def load_checkpoint(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    if path.suffix == ".gguf":
        return _load_gguf(path)
    return _load_hf_folder(path)


def _load_hf_folder(folder: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        state.update(load_file(shard))
    if not state:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return config, to_worker_layout(state, config)


def _load_gguf(path: Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    hf = model.config.to_dict() | {"architectures": [type(model).__name__]}
    config = ModelConfig.from_hf(hf)
    return config, to_worker_layout(model.state_dict(), config)


def to_worker_layout(hf_state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    state = {name.removeprefix("model."): tensor for name, tensor in hf_state.items()}
    for layer in range(config.num_layers):
        prefix = f"layers.{layer}."
        for fused, parts in _FUSED.items():
            for kind in ("weight", "bias"):
                names = [f"{prefix}{part}.{kind}" for part in parts]
                if names[0] in state:
                    state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(name) for name in names])
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state
