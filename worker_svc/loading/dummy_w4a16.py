"""Dummy 4-bit weights, for benchmarks of the real shapes: a dummy checkpoint's decoder projections and a mixture's
experts rounded to 4 bits in groups of 128 inputs (one group a row where 128 does not divide them), as a checkpoint of
the named method holds them (AWQ with zero points; GPTQ and compressed-tensors symmetric). Routers stay as they are."""
import torch

from sluice.worker.loading.w4a16_checkpoint import LAYOUT_TENSORS, layout_tensors
from sluice.worker.ops.fp8 import QUANTIZED_EXPERTS, QUANTIZED_LINEARS

GROUP_SIZE = 128


def as_dummy_w4a16(state: dict[str, torch.Tensor], method: str) -> dict[str, torch.Tensor]:
    """In place, a projection at a time: the worker-layout state with each decoder projection's weight in the 4-bit
    layout (name.qweight, .scales and, for AWQ, .zeros), and each layer's stacked experts (mlp.experts.w13, w2) as
    stacks of them (w13.qweight, ...)."""
    from sluice.kernels.w4a16_layout import quantize, stack  # imports Triton: only where a 4-bit model runs

    sym = method != "awq"
    for name in list(state):
        if not name.startswith("layers."):
            continue
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.endswith(QUANTIZED_LINEARS):
            weight = state.pop(name)
            state.update(layout_tensors(module, quantize(weight, _group(weight), sym)))
        elif name.endswith(QUANTIZED_EXPERTS):
            experts = state.pop(name)
            stacked = stack([quantize(weight, _group(weight), sym) for weight in experts])
            state.update({f"{name}.{kind}": getattr(stacked, kind) for kind in LAYOUT_TENSORS
                          if getattr(stacked, kind) is not None})
    return state


def _group(weight: torch.Tensor) -> int:
    return GROUP_SIZE if weight.shape[-1] % GROUP_SIZE == 0 else weight.shape[-1]
