"""A pre-quantized checkpoint's FP8 weight scales in the worker's layout: one float32 scale per output channel."""
import torch

from sluice.worker.ops.fp8 import dequantize_blocks, quantize_rows


def per_channel_scales(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state with every weight_scale as float32 [rows of its weight] and without input scales."""
    converted = {}
    for name, tensor in state.items():
        if name.endswith(".input_scale"):
            continue
        if name.endswith(".weight_scale"):
            rows = state[name.removesuffix("_scale")].shape[0]
            tensor = tensor.float().reshape(-1)
            tensor = tensor.expand(rows).clone() if tensor.numel() == 1 else tensor.reshape(rows)
        converted[name] = tensor
    return converted


def per_channel_from_blocks(weight: torch.Tensor, block_scale: torch.Tensor,
                            block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale [rows]): a block-wise weight (block_scale [ceil(rows / block rows), ceil(columns /
    block columns)], the last blocks cut at the edges) dequantized and quantized again per output channel."""
    return quantize_rows(dequantize_blocks(weight, block_scale.float(), block))
