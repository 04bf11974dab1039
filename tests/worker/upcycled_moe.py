"""SmolLM2 as a mixture of experts: a Mixtral or gpt-oss folder whose experts are slices of SmolLM2's MLP, so that FP8
experts can be measured on a real model's weights and activations."""
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

_SINK = -1e4  # an attention sink logit too low to weigh in any softmax


def write_upcycled_mixtral(source: Path, target: Path, num_experts: int) -> Path:
    """A MixtralForCausalLM folder of the Llama folder `source`: each layer's MLP cut into num_experts experts of
    intermediate_size / num_experts columns, every expert routed (top-k of all) with equal weights by a zero router,
    each expert's down projection times num_experts. It computes the source model's function; the tokenizer files
    are copied beside it."""
    hf_config = _copy_tokenizer(source, target)
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


def write_upcycled_gpt_oss(source: Path, target: Path, num_experts: int) -> Path:
    """A GptOssForCausalLM folder of the Llama folder `source` that computes its function: zero attention biases,
    sinks too low to weigh in any softmax, full attention in every layer, and each layer's MLP cut into experts as
    write_upcycled_mixtral cuts it (a zero router), in transformers' stacked layout; the clamped SwiGLU becomes
    silu(gate) * up with alpha 1, a limit no activation reaches, and a bias of -1 on every up column for its + 1. The
    tokenizer files are copied beside it."""
    hf_config = _copy_tokenizer(source, target)
    width, hidden = hf_config["intermediate_size"] // num_experts, hf_config["hidden_size"]
    hf_config |= {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_local_experts": num_experts,
                  "num_experts_per_tok": num_experts, "intermediate_size": width, "attention_bias": True,
                  "layer_types": ["full_attention"] * hf_config["num_hidden_layers"], "swiglu_alpha": 1.0,
                  "swiglu_limit": 1e4}
    (target / "config.json").write_text(json.dumps(hf_config, indent=2))
    dense = load_file(source / "model.safetensors")
    state = {name: tensor for name, tensor in dense.items() if ".mlp." not in name}
    for layer in range(hf_config["num_hidden_layers"]):
        attention, mlp = f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.mlp."
        for projection in ("q_proj", "k_proj", "v_proj", "o_proj"):
            state[f"{attention}{projection}.bias"] = torch.zeros(dense[f"{attention}{projection}.weight"].shape[0])
        state[f"{attention}sinks"] = torch.full((hf_config["num_attention_heads"],), _SINK)
        state[f"{mlp}router.weight"] = torch.zeros(num_experts, hidden)
        state[f"{mlp}router.bias"] = torch.zeros(num_experts)
        gate, up, down = (dense[f"{mlp}{name}.weight"] for name in ("gate_proj", "up_proj", "down_proj"))
        gate_up = torch.stack([gate, up], dim=1).view(num_experts, 2 * width, hidden)  # gate and up rows interleaved
        state[f"{mlp}experts.gate_up_proj"] = gate_up.transpose(1, 2).contiguous()  # [experts, hidden, 2 * width]
        state[f"{mlp}experts.gate_up_proj_bias"] = torch.tensor([0.0, -1.0]).repeat(num_experts, width)
        down = down.view(hidden, num_experts, width).permute(1, 2, 0) * num_experts  # [experts, width, hidden]
        state[f"{mlp}experts.down_proj"] = down.contiguous()
        state[f"{mlp}experts.down_proj_bias"] = torch.zeros(num_experts, hidden)
    save_file(state, target / "model.safetensors")
    return target


def _copy_tokenizer(source: Path, target: Path) -> dict:
    """source's config, once its other files but the weights (the tokenizer's) are copied into target, a new folder."""
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix not in (".safetensors", ".gguf") and path.name != "config.json":
            shutil.copy(path, target / path.name)
    return json.loads((source / "config.json").read_text())
