"""Pre-quantized FP8 folders of a float checkpoint, laid out as they are published on the Hugging Face hub: every
projection (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; every expert's, Mixtral's w1, w3 and w2
included) on its own, in e4m3 with its weight_scale, the embedding, the norms and the routers as they were, and the
tokenizer files beside them."""
import json
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from sluice.worker.ops.fp8 import FP8_MAX, quantize_rows, to_fp8

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
STATIC_INPUT_SCALE = 0.05  # a static activation scale the worker does not read (it quantizes per token)
BLOCK = (128, 128)  # the weight blocks of strategy "block", as Qwen's and DeepSeek's FP8 releases have them


def write_fp8_checkpoint(source: Path, target: Path, method: str, strategy: str, ignore: tuple[str, ...] = (),
                         block: tuple[int, int] = BLOCK) -> Path:
    """method: "fp8" (weight_scale [out] per channel or [] per tensor, static input_scale []), "compressed-tensors"
    ([out, 1] per channel with activations dynamic per token, [1] per tensor with a static input_scale [1]),
    "fbgemm_fp8" ([out, 1], per channel only) or "modelopt" (as "fp8", its config in hf_quant_config.json, as NVIDIA's
    first releases have it); strategy: "channel" (the rows and scales that `--quantization fp8`
    computes), "tensor" or "block" (one scale per block of `block`, activations dynamic: fp8's weight_scale_inv,
    compressed-tensors' weight_scale); ignore: the Hugging Face names of projections kept as they are, listed in the
    config beside lm_head."""
    target.mkdir(parents=True)
    for path in source.iterdir():
        if path.suffix not in (".safetensors", ".gguf") and path.name != "config.json":
            shutil.copy(path, target / path.name)
    hf_config = json.loads((source / "config.json").read_text())
    quantization = _quantization_config(method, strategy, ["lm_head", *ignore], block)
    if method == "modelopt":
        (target / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"},
                                                                 "quantization": quantization}))
    else:
        hf_config["quantization_config"] = quantization
    (target / "config.json").write_text(json.dumps(hf_config, indent=2))
    state = {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if not name.removesuffix(".weight").endswith(PROJECTIONS) or name.removesuffix(".weight") in ignore:
            state[name] = tensor
            continue
        if strategy == "block":
            state[name], state[name + ("_scale_inv" if method == "fp8" else "_scale")] = quantize_blocks(tensor, block)
            continue
        weight, scale = quantize_rows(tensor) if strategy == "channel" else _quantize_tensor(tensor)
        state[name], state[name + "_scale"] = weight, scale.reshape(_scale_shape(method, strategy, len(weight)))
        if method == "fp8" or method == "modelopt" and strategy == "tensor":  # a static activation scheme
            input_scale = torch.full(_scale_shape(method, "tensor", 1), STATIC_INPUT_SCALE)
            state[name.removesuffix("weight") + "input_scale"] = input_scale
    save_file(state, target / "model.safetensors")
    return target


def _quantize_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, scale [1]): the whole tensor's absolute maximum maps to the e4m3 maximum."""
    weight_q, scale = quantize_rows(weight.reshape(1, -1))
    return weight_q.reshape(weight.shape), scale


def quantize_blocks(weight: torch.Tensor, block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, scale [ceil(rows / block rows), ceil(columns / block columns)]): each block's absolute maximum
    maps to the e4m3 maximum; the blocks at the edges are cut."""
    rows, columns = weight.shape
    padded = F.pad(weight.float(), (0, -columns % block[1], 0, -rows % block[0]))
    blocks = padded.unflatten(1, (-1, block[1])).unflatten(0, (-1, block[0]))  # [row blocks, rows, column blocks, ...]
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)
    quantized = to_fp8(blocks, scale[:, None, :, None]).flatten(2).flatten(0, 1)[:rows, :columns]
    return quantized.contiguous(), scale


def _scale_shape(method: str, strategy: str, rows: int) -> tuple[int, ...]:
    scalar_shaped = method in ("fp8", "modelopt")
    if strategy == "tensor":
        return () if scalar_shaped else (1,)
    return (rows,) if scalar_shaped else (rows, 1)


def _quantization_config(method: str, strategy: str, ignore: list[str], block: tuple[int, int]) -> dict:
    if method == "fp8" and strategy == "block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block),
                "ignored_layers": ignore}
    if method == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ignore}
    if method == "modelopt":
        algo = "FP8" if strategy == "tensor" else "FP8_PER_CHANNEL_PER_TOKEN"
        return {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ignore}
    if method == "fbgemm_fp8":
        return {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ignore}
    static = strategy == "tensor"
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    activations = {"num_bits": 8, "type": "float", "strategy": "tensor" if static else "token", "symmetric": True,
                   "dynamic": not static}
    if strategy == "block":
        weights["block_structure"] = list(block)
        activations |= {"strategy": "group", "group_size": block[1]}
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "ignore": ignore, "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": weights, "input_activations": activations,
        }},
    }


def write_kv_cache_scales(folder: Path, k_scale: float, v_scale: float) -> Path:
    """Adds a calibrated FP8 KV cache to a folder: to one of write_fp8_checkpoint, its method's scheme and names (fp8:
    AutoFP8's kv_cache_scheme "static" with k_proj / v_proj.output_scale []; modelopt: kv_cache_quant_algo FP8 with
    k_proj.k_scale / v_proj.v_scale []; compressed-tensors: self_attn.k_scale / v_scale [1]); to a float folder, a
    compressed-tensors config of KV-cache scales alone."""
    hf_config = json.loads((folder / "config.json").read_text())
    modelopt = folder / "hf_quant_config.json"
    if modelopt.exists():
        config = json.loads(modelopt.read_text())
        config["quantization"]["kv_cache_quant_algo"] = "FP8"
        modelopt.write_text(json.dumps(config))
        names, shape = ("k_proj.k_scale", "v_proj.v_scale"), ()
    else:
        quantization = hf_config.setdefault("quantization_config", {
            "quant_method": "compressed-tensors", "format": "dense", "config_groups": {}, "ignore": []})
        auto_fp8 = quantization["quant_method"] == "fp8"
        quantization["kv_cache_scheme"] = "static" if auto_fp8 else {
            "num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}
        (folder / "config.json").write_text(json.dumps(hf_config, indent=2))
        names, shape = (("k_proj.output_scale", "v_proj.output_scale"), ()) if auto_fp8 else (("k_scale", "v_scale"),
                                                                                              (1,))
    state = load_file(folder / "model.safetensors")
    for layer in range(hf_config["num_hidden_layers"]):
        for name, scale in zip(names, (k_scale, v_scale)):
            state[f"model.layers.{layer}.self_attn.{name}"] = torch.full(shape, scale)
    save_file(state, folder / "model.safetensors")
    return folder
