"""Dummy 4-bit weights, for benchmarks of the real shapes: a dummy checkpoint's decoder projections rounded to 4 bits
in groups of 128 inputs (one group a row where 128 does not divide them), as a checkpoint of the named method holds them (AWQ with zero points; GPTQ and
compressed-tensors symmetric)."""
import torch

from sluice.worker.loading.w4a16_checkpoint import layout_tensors
from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.fp8 import QUANTIZED_LINEARS

GROUP_SIZE = 128


def as_dummy_w4a16(state: dict[str, torch.Tensor], config: ModelConfig, method: str) -> dict[str, torch.Tensor]:
    """In place, a projection at a time: the worker-layout state with each decoder projection's weight in the 4-bit
    layout (name.qweight, .scales and, for AWQ, .zeros)."""
    from sluice.kernels.w4a16_layout import quantize  # imports Triton: only where a 4-bit model runs

    if config.moe is not None:
        raise ValueError(f"4-bit ({method}) weights of mixtures of experts ({config.architecture}) are not supported")
    for name in list(state):
        module = name.removesuffix(".weight")
        if name.startswith("layers.") and name.endswith(".weight") and module.endswith(QUANTIZED_LINEARS):
            weight = state.pop(name)
            group = GROUP_SIZE if weight.shape[1] % GROUP_SIZE == 0 else weight.shape[1]
            state.update(layout_tensors(module, quantize(weight, group, sym=method != "awq")))
    return state
