"""MXFP4 experts (quant_method "mxfp4": gpt-oss's published checkpoints), dequantized at load, as no MXFP4 kernel
exists yet. A projection's `<name>_blocks` (uint8 [..., rows, groups, 16]: 32 e2m1 values per group, two per byte,
the low nibble first) and `<name>_scales` (uint8 [..., rows, groups]: e8m0 exponents, 2^(scale - 127) per group), a
row per output feature, become `<name>` as transformers holds it dequantized: [experts, in features, out features]."""
from pathlib import Path

import torch

from sluice.worker.loading.named_tensors import tensors_ending_with

BLOCKS, SCALES = "_blocks", "_scales"
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def is_mxfp4(hf_config: dict) -> bool:
    return (hf_config.get("quantization_config") or {}).get("quant_method") == "mxfp4"


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """[..., rows, groups * 32]: exact in bfloat16, whose exponents span e8m0's."""
    values = torch.tensor(_E2M1, dtype=dtype)[torch.stack([blocks & 0x0F, blocks >> 4], dim=-1).long()]
    exponents = scales.to(torch.int32)[..., None] - 127
    return torch.ldexp(values.flatten(-2), exponents).to(dtype).flatten(-2)


def mxfp4_scales(files: list[Path]) -> dict[str, torch.Tensor]:
    """Each MXFP4 projection's name and its scales, from any of the files."""
    return {name.removesuffix(SCALES): scales for name, scales in tensors_ending_with(files, (SCALES,)).items()}


def dequantized_projection(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """A stacked projection [experts, in features, out features] from its blocks and scales, expert by expert
    (bounding the temporary memory)."""
    return torch.stack([dequantize_mxfp4(b, s) for b, s in zip(blocks, scales)]).transpose(1, 2)
