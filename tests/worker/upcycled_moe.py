"""SmolLM2 as a mixture of experts: a Mixtral folder whose experts are slices of SmolLM2's MLP, so that FP8 experts can
be measured on a real model's weights and activations."""
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def write_upcycled_mixtral(source: Path, target: Path, num_experts: int) -> Path:
    """A MixtralForCausalLM folder of the Llama folder `source`: each layer's MLP cut into num_experts experts of
    intermediate_size / num_experts columns, every expert routed (top-k of all) with equal weights by a zero router,
    each expert's down projection times num_experts. It computes the source model's function; the tokenizer files
    are copied beside it."""
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix not in (".safetensors", ".gguf") and path.name != "config.json":
            shutil.copy(path, target / path.name)
    hf_config = json.loads((source / "config.json").read_text())
    width = hf_config["intermediate_size"] // num_experts
    hf_config |= {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "num_local_experts": num_experts,
                  "num_experts_per_tok": num_experts, "intermediate_size": width, "sliding_window": None}
    (target / "config.json").write_text(json.dumps(hf_config, indent=2))
    dense = load_file(source / "model.safetensors")
    state = {name: tensor for name, tensor in dense.items() if ".mlp." not in name}
    for layer in range(hf_config["num_hidden_layers"]):
        mlp, moe = f"model.layers.{layer}.mlp.", f"model.layers.{layer}.block_sparse_moe."
        state[f"{moe}gate.weight"] = torch.zeros(num_experts, hf_config["hidden_size"])
        for expert in range(num_experts):
            columns = slice(expert * width, (expert + 1) * width)
            state[f"{moe}experts.{expert}.w1.weight"] = dense[f"{mlp}gate_proj.weight"][columns].contiguous()
            state[f"{moe}experts.{expert}.w3.weight"] = dense[f"{mlp}up_proj.weight"][columns].contiguous()
            state[f"{moe}experts.{expert}.w2.weight"] = dense[f"{mlp}down_proj.weight"][:, columns] * num_experts
    save_file(state, target / "model.safetensors")
    return target
