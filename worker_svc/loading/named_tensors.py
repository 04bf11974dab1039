"""Tensors picked by name from a checkpoint's safetensors files."""
from pathlib import Path

import torch


def tensors_ending_with(files: list[Path], suffixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Every tensor of the files whose name ends with one of suffixes, by its name."""
    from safetensors import safe_open

    tensors = {}
    for shard in files:
        with safe_open(shard, framework="pt") as file:
            tensors |= {name: file.get_tensor(name) for name in file.keys() if name.endswith(suffixes)}
    return tensors
