"""Tiny Llama (or mixture-of-experts) checkpoints in 4 bits, laid out as GPTQ, AutoAWQ and llm-compressor publish them,
with our packers (tests/kernels/w4a16_packing.py): every projection quantized by round-to-nearest into known int4
values, in groups (GPTQ's act-order and compressed-tensors' actorder "group" scatter them, one order per input that
projections share, as GPTQ's Hessian order is) or one a row, experts each on its own and routers unquantized, as
published; and beside each, its reference: the same model with every projection dequantized, in float32, which
transformers loads."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from sluice.kernels.w4a16_layout import SYMMETRIC_ZERO, round_to_nearest
from tests.kernels.w4a16_packing import to_awq, to_compressed_tensors, to_gptq
from tests.worker.test_moe_families import lively_state

TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
              "eos_token_id": 0, "pad_token_id": 255, "tie_word_embeddings": False}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
               "w1", "w3", "w2")  # the last three: Mixtral's experts' gate, up and down
_SAME_INPUTS = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj", "w3": "w1"}  # share their inputs' order


@dataclass(frozen=True)
class Variant:
    method: str  # "gptq", "awq" or "compressed-tensors"
    group: int | None = 64  # None: one group a row (GPTQ's group_size -1, compressed-tensors' "channel")
    sym: bool = True
    act_order: bool = False
    gptq_v2: bool = False
    ignore: tuple[str, ...] = ()  # projections (Hugging Face module names) stored unquantized


def quantize(weight: torch.Tensor, group: int, sym: bool, g_idx: torch.Tensor, scale_dtype: torch.dtype):
    """round_to_nearest's (q [K, N], zero points [G, N] or None, scales [G, N]) and the dequantized float32 weight
    [N, K]; g_idx [K]: the group of each input."""
    q, zeros, scales = round_to_nearest(weight, group, sym, g_idx, scale_dtype)
    z = SYMMETRIC_ZERO if zeros is None else zeros[g_idx.long()]
    return q, zeros, scales, ((q - z).float() * scales.float()[g_idx.long()]).T.contiguous()


def write_w4a16_checkpoint(folder: Path, variant: Variant, hf_config: dict = TINY_LLAMA, seed: int = 0,
                           state: dict[str, torch.Tensor] | None = None):
    """(the 4-bit folder, its dequantized float32 reference folder) under folder, of the model of hf_config whose
    Hugging Face state is `state` (lively random weights by default)."""
    generator = torch.Generator().manual_seed(seed)
    state = lively_state(hf_config) if state is None else state
    stored, reference = {}, {}
    orders = {}
    for name, tensor in state.items():
        module = name.removesuffix(".weight")
        projection = module.rsplit(".", 1)[-1]
        if projection not in PROJECTIONS or module in variant.ignore:
            stored[name] = reference[name] = tensor
            continue
        k = tensor.shape[1]
        group = variant.group or k
        g_idx = torch.arange(k) // group
        if variant.act_order:
            key = (module.rsplit(".", 1)[0], _SAME_INPUTS.get(projection, projection))
            if key not in orders:
                orders[key] = torch.argsort(torch.randperm(k, generator=generator)) // group
            g_idx = orders[key]
        scale_dtype = torch.bfloat16 if variant.method == "compressed-tensors" else torch.float16
        q, z, scales, reference[name] = quantize(tensor, group, variant.sym, g_idx, scale_dtype)
        stored.update(_packed(variant, module, q, z, scales, g_idx.to(torch.int32)))
    quantized = folder / f"{variant.method}-4bit"
    dequantized = folder / f"{variant.method}-dequantized"
    for target, tensors, config in ((quantized, stored, {**hf_config, "quantization_config": _config(variant)}),
                                    (dequantized, reference, hf_config)):
        target.mkdir(parents=True)
        save_file({name: t.contiguous() for name, t in tensors.items()}, target / "model.safetensors")
        (target / "config.json").write_text(json.dumps(config, indent=2))
    return quantized, dequantized


def _packed(variant: Variant, module: str, q, z, scales, g_idx) -> dict[str, torch.Tensor]:
    if variant.method == "gptq":
        qweight, qzeros = to_gptq(q, z, scales, v1=not variant.gptq_v2)
        return {f"{module}.qweight": qweight, f"{module}.qzeros": qzeros, f"{module}.scales": scales,
                f"{module}.g_idx": g_idx}
    if variant.method == "awq":
        return {f"{module}.qweight": to_awq(q), f"{module}.qzeros": to_awq(z), f"{module}.scales": scales}
    packed, zero_point = to_compressed_tensors(q, z)
    tensors = {f"{module}.weight_packed": packed, f"{module}.weight_scale": scales.T.contiguous(),
               f"{module}.weight_shape": torch.tensor([q.shape[1], q.shape[0]], dtype=torch.int32)}
    if zero_point is not None:
        tensors[f"{module}.weight_zero_point"] = zero_point
    if variant.act_order:
        tensors[f"{module}.weight_g_idx"] = g_idx
    return tensors


def _config(variant: Variant) -> dict:
    ignore = [module.removeprefix("model.") for module in variant.ignore]
    if variant.method == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": variant.group or -1, "desc_act": variant.act_order,
                "sym": variant.sym, "checkpoint_format": "gptq_v2" if variant.gptq_v2 else "gptq",
                "modules_to_not_convert": ignore or None}
    if variant.method == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": variant.group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": ignore or None}
    weights = {"num_bits": 4, "type": "int", "symmetric": variant.sym,
               "strategy": "group" if variant.group else "channel", "group_size": variant.group,
               "actorder": "group" if variant.act_order else None, "dynamic": False}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None}},
            "ignore": ["lm_head", *variant.ignore]}
