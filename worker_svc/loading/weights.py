"""Weights from a Hugging Face folder (config.json + safetensors, pre-quantized FP8, 4-bit and MXFP4 experts included)
or a GGUF file, renamed to the worker's layout."""
import dataclasses
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path

import torch

from sluice.worker.loading.fp8_checkpoint import (activation_absmax_bound, checkpoint_quantization, quantization_config,
                                                  weight_block_size)
from sluice.worker.loading.fp8_scales import per_channel_from_blocks, per_channel_scales
from sluice.worker.loading.mxfp4 import BLOCKS, SCALES, dequantized_projection, is_mxfp4, mxfp4_scales
from sluice.worker.loading.named_tensors import tensors_ending_with
from sluice.worker.loading.stacked_experts import arrange_stacked_experts
from sluice.worker.loading.w4a16_checkpoint import LAYOUT_TENSORS, fuse_w4a16, layout_tensors, shard_w4a16, w4a16_scheme
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.registry import ArchitectureTraits, traits_for
from sluice.worker.models.shard_layout import FUSED_PROJECTIONS, ShardLayout, gather_pieces

log = logging.getLogger("sluice.worker")
_BLOCK_SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale")  # fp8's and compressed-tensors' names


WeightFilter = Callable[[ModelConfig], Callable[[str], bool]]  # a model's config -> whether to read a weight


def load_checkpoint(path: Path, rank: int = 0, world_size: int = 1, expert_parallel: bool = False,
                    wanted: WeightFilter | None = None) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """The whole model's config, and the weights of tensor-parallel rank `rank` of world_size (see shard_layout);
    wanted: which weights, by their checkpoint names, a Hugging Face folder's model reads (None: every one; a
    pipeline stage reads its own)."""
    if path.suffix == ".gguf":
        return _load_gguf(path, rank, world_size)
    return _load_hf_folder(path, rank, world_size, expert_parallel, wanted or (lambda config: lambda name: True))


def _load_hf_folder(folder: Path, rank: int, world_size: int, expert_parallel: bool,
                    wanted: WeightFilter) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Reads only the rank's slice of each sharded tensor from the files (a block-wise FP8 weight whole, to quantize it
    again per channel, but an expert's, which keeps its blocks; MXFP4 experts whole, to dequantize them). A
    quantization_config the worker cannot load fails here, before any weight is read (fp8_checkpoint.py,
    w4a16_checkpoint.py). A 4-bit projection's tensors are read whole, converted once to the W4A16 layout, then cut to
    the rank's slice. A weight
    stored under transformers' module name (model.language_model.*) is read as the published name (model.*)."""
    from safetensors import safe_open

    hf_config = json.loads((folder / "config.json").read_text())
    hf_config["quantization_config"] = quantization_config(folder, hf_config)
    mxfp4, w4a16 = is_mxfp4(hf_config), w4a16_scheme(hf_config)
    quantization = w4a16.method if w4a16 else None if mxfp4 else checkpoint_quantization(hf_config)
    block = weight_block_size(hf_config)
    config = ModelConfig.from_hf(hf_config)
    config = dataclasses.replace(config, quantization=quantization,
                                 activation_absmax_bound=activation_absmax_bound(hf_config),
                                 expert_weight_block=None if config.moe is None else block)
    layout = ShardLayout(config, rank, world_size, expert_parallel)
    reads = wanted(config)
    prefixes = traits_for(config.architecture).checkpoint_prefixes
    files = sorted(folder.glob("*.safetensors"))
    block_scales = _block_scales(files, prefixes) if block else {}
    fp4_scales = mxfp4_scales(files) if mxfp4 else {}
    if block:
        layout.check_expert_blocks(block)
        log.warning("block-wise FP8 weights (blocks of %d x %d) are quantized again per output channel, but a "
                    "mixture's experts: a little less accurate than the checkpoint", *block)
    state: dict[str, torch.Tensor] = {}
    packed: dict[str, dict[str, torch.Tensor]] = {}  # a 4-bit projection's stored tensors, by their suffix
    for shard in files:
        with safe_open(shard, framework="pt") as file:
            for stored in file.keys():
                name = published_name(stored, prefixes)
                if not reads(name):
                    continue
                module, _, suffix = name.rpartition(".")
                if w4a16 and suffix in w4a16.tensor_names:
                    if layout.holds(f"{module}.weight"):
                        packed.setdefault(module, {})[suffix] = file.get_tensor(stored)
                    continue
                if mxfp4 and name.endswith(SCALES):
                    continue
                if mxfp4 and name.endswith(BLOCKS):
                    dequantized = name.removesuffix(BLOCKS)
                    weight = dequantized_projection(file.get_tensor(stored), fp4_scales[dequantized])
                    state[dequantized] = layout.shard(dequantized, weight)
                    continue
                if block and name.endswith(_BLOCK_SCALE_SUFFIXES) or not layout.holds(name):
                    continue
                if name in block_scales and not layout.is_expert(name):
                    weight, scale = per_channel_from_blocks(file.get_tensor(stored), block_scales[name], block)
                    state[name] = layout.shard(name, weight)
                    state[f"{name}_scale"] = layout.shard(f"{name}_scale", scale)
                    continue
                if name in block_scales:  # an expert keeps its blocks: the fused MoE kernels read them
                    state[f"{name}_block_scale"] = layout.shard_block_scale(name, block_scales[name].float(), block)
                part, pieces = file.get_slice(stored), layout.pieces_of(name)
                if pieces is None or math.prod(part.get_shape()) == 1:  # a per-tensor scale is every rank's
                    state[name] = file.get_tensor(stored)
                else:
                    state[name] = gather_pieces(
                        lambda piece: part[(slice(None),) * piece.dim + (slice(piece.start, piece.stop),)], pieces)
    if not state:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    for module in list(packed):  # one projection at a time: converted, then cut to the rank's slice
        state.update(layout_tensors(module, shard_w4a16(layout, module, w4a16.convert(packed.pop(module)))))
    return config, to_worker_layout(state, config)


def _block_scales(files: list[Path], prefixes: tuple[tuple[str, str], ...]) -> dict[str, torch.Tensor]:
    """Each block-wise weight's published name and its block scales (weight_scale_inv or weight_scale), from any of
    the files."""
    return {published_name(name, prefixes).removesuffix("_inv").removesuffix("_scale"): scales
            for name, scales in tensors_ending_with(files, _BLOCK_SCALE_SUFFIXES).items()}


def published_name(name: str, prefixes: tuple[tuple[str, str], ...]) -> str:
    """A checkpoint weight's name as the published checkpoints spell it: under the first of prefixes' (transformers'
    module prefix, the published one) whose module prefix it has, renamed."""
    for module_prefix, published in prefixes:
        if name.startswith(module_prefix):
            return published + name.removeprefix(module_prefix)
    return name


def _load_gguf(path: Path, rank: int, world_size: int) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """GGUF tensors are quantised as a whole: dequantised by transformers, then sliced."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    hf = model.config.to_dict() | {"architectures": [type(model).__name__]}
    config = ModelConfig.from_hf(hf)
    layout = ShardLayout(config, rank, world_size)
    state = {name: layout.shard(name, tensor) for name, tensor in model.state_dict().items()}
    return config, to_worker_layout(state, config)


def to_worker_layout(hf_state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights renamed, stacked and fused as the worker's modules hold them. Empties hf_state: a tensor stacked
    or fused into a new one is freed at once, so loading never holds a model's experts twice."""
    state = {name.removeprefix("model."): tensor for name, tensor in per_channel_scales(hf_state).items()}
    hf_state.clear()
    for layer in range(config.num_layers):
        prefix = f"layers.{layer}."
        traits = traits_for(config.architecture)
        if config.has_experts(layer) and traits.stacked_experts:
            arrange_stacked_experts(state, prefix)
        elif config.has_experts(layer):
            stack_experts(state, prefix, traits, config.moe.num_experts)
        for fused, parts in FUSED_PROJECTIONS.items():
            if not {f"{prefix}{parts[0]}.weight", f"{prefix}{parts[0]}.qweight"} & state.keys():
                continue  # fused as published, or a layer without it
            _check_one_precision(state, prefix, parts)
            kinds = ("weight", "weight_scale", "bias")
            if f"{prefix}{parts[0]}.qweight" in state:
                fuse_w4a16(state, [f"{prefix}{part}" for part in parts], f"{prefix}{fused}")
                kinds = ("bias",)
            for kind in kinds:
                names = [f"{prefix}{part}.{kind}" for part in parts]
                if names[0] in state:
                    state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(name) for name in names])
    if config.tie_word_embeddings and "embed_tokens.weight" in state:  # a middle pipeline stage reads neither
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


def stack_experts(state: dict[str, torch.Tensor], prefix: str, traits: ArchitectureTraits, num_experts: int) -> None:
    """In place: the layer's experts (those the state holds, in order) stacked into mlp.experts.w13 and w2 (FP8 ones'
    scales alike into w13_scale and w2_scale, a scale per row or per block; see models.moe.Experts; 4-bit ones'
    layout tensors into w13.qweight, .scales, .zeros and w2's, see ops.w4a16.W4A16ExpertWeights), where the rank
    holds some only the map of their local indices (mlp.expert_map), and its router named as the worker's module
    (mlp.gate)."""
    moe = f"{prefix}{traits.expert_prefix}."
    gate, up, down = traits.expert_projections
    held = sorted({int(name[len(moe) + len("experts."):].split(".")[0]) for name in state
                   if name.startswith(f"{moe}experts.")})
    expert = [f"{moe}experts.{e}." for e in held]
    _check_experts_precision(state, [f"{e}{part}" for e in expert for part in (gate, up, down)])
    if f"{expert[0]}{gate}.qweight" in state:
        _stack_w4a16_experts(state, prefix, expert, traits.expert_projections)
    for kind, suffix in (("weight", ""), ("weight_scale", "_scale"), ("weight_block_scale", "_scale")):
        if f"{expert[0]}{gate}.{kind}" in state:
            state[f"{prefix}mlp.experts.w13{suffix}"] = _stacked(state, [[f"{e}{gate}.{kind}", f"{e}{up}.{kind}"]
                                                                         for e in expert])
            state[f"{prefix}mlp.experts.w2{suffix}"] = _stacked(state, [[f"{e}{down}.{kind}"] for e in expert])
    state[f"{prefix}mlp.gate.weight"] = state.pop(f"{moe}gate.weight")
    if len(held) < num_experts:
        expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
        expert_map[held] = torch.arange(len(held), dtype=torch.int32)
        state[f"{prefix}mlp.expert_map"] = expert_map


def _stack_w4a16_experts(state: dict[str, torch.Tensor], prefix: str, experts: list[str],
                         projections: tuple[str, str, str]) -> None:
    """In place: each expert's 4-bit gate and up fused along N (as a dense gate_up_proj), then every expert's layout
    tensors stacked: mlp.experts.w13.qweight [E, H / 8, 2I], .scales and .zeros [E, groups, 2I] and, with act-order,
    .perm [E, H] (each expert's own), and w2's [E, I / 8, H], [E, groups, H] and .perm [E, I] (or, on a rank that
    holds part of each expert's intermediate, .group_index [E, I / ranks])."""
    gate, up, down = projections
    for expert in experts:
        fuse_w4a16(state, [f"{expert}{gate}", f"{expert}{up}"], f"{expert}w13")
    for kind in LAYOUT_TENSORS:
        for part, module in (("w13", "w13"), ("w2", down)):
            if f"{experts[0]}{module}.{kind}" in state:
                state[f"{prefix}mlp.experts.{part}.{kind}"] = _stacked(state,
                                                                       [[f"{e}{module}.{kind}"] for e in experts])


def _stacked(state: dict[str, torch.Tensor], names: list[list[str]]) -> torch.Tensor:
    """Popped from the state into one new tensor: entry i is names[i]'s tensors concatenated. Each is freed as soon
    as it is copied, so a layer's experts never need twice their memory."""
    first = [state[name] for name in names[0]]
    rows = sum(part.shape[0] for part in first)
    stacked = torch.empty((len(names), rows, *first[0].shape[1:]), dtype=first[0].dtype, device=first[0].device)
    for entry, parts in zip(stacked, names):
        torch.cat([state.pop(name) for name in parts], out=entry)
    return stacked


def _check_experts_precision(state: dict[str, torch.Tensor], modules: list[str]) -> None:
    """A layer's experts' projections are all FP8, all 4-bit or all unquantized: one grouped GEMM runs them."""
    precisions = {module: _stored_precision(state, module) for module in modules}
    if len(set(precisions.values())) > 1:
        first = modules[0]
        other = next(module for module in modules if precisions[module] != precisions[first])
        raise ValueError(f"the experts of a layer must share a precision; the checkpoint stores {first} in "
                         f"{precisions[first]} and {other} in {precisions[other]}")


def _stored_precision(state: dict[str, torch.Tensor], module: str) -> str:
    return "int4" if f"{module}.qweight" in state else str(state[f"{module}.weight"].dtype)


def _check_one_precision(state: dict[str, torch.Tensor], prefix: str, parts: tuple[str, ...]) -> None:
    """The projections fused into one are all FP8, all 4-bit or all unquantized (an ignore list names all of them or
    none)."""
    dtypes = {part: _stored_precision(state, f"{prefix}{part}") for part in parts}
    if len(set(dtypes.values())) > 1:
        stored = ", ".join(f"{prefix}{part} in {dtype}" for part, dtype in dtypes.items())
        raise ValueError(f"the projections fused into one must share a precision; the checkpoint stores {stored}")
