"""4-bit linear layers (W4A16): int4 weights in kernels.w4a16_layout's layout, activations in the model dtype.

A pre-quantized GPTQ, AWQ or compressed-tensors checkpoint's projections arrive in the worker's state converted
(loading/w4a16_checkpoint.py) as name.qweight, .scales and, where the checkpoint has them, .zeros (asymmetric) and
.perm (act-order); as_w4a16_linears swaps the model's nn.Linear for a W4A16Linear of the same tensors before the
state is loaded. TorchOps dequantizes and multiplies (w4a16_linear_ref), TritonOps runs w4a16_linear.
"""
import functools

import torch
from torch import nn


class W4A16Linear(nn.Module):
    """The tensors of a W4A16Weight (see kernels.w4a16_layout) as buffers, and the float bias."""

    def __init__(self, in_features: int, out_features: int, groups: int, zeros: bool, perm: bool,
                 bias: bool = False, device: torch.device | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.empty(in_features // 8, out_features, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.empty(groups, out_features, device=device))
        self.register_buffer("zeros", torch.empty(groups, out_features, dtype=torch.uint8, device=device)
                             if zeros else None)
        self.register_buffer("perm", torch.empty(in_features, dtype=torch.int32, device=device) if perm else None)
        self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False) if bias else None

    @functools.cached_property
    def w4a16(self):
        """The layer's weight as the kernels take it (a W4A16Weight, checked once: the buffers are set at load and
        never replaced), so a step's linears pay no checks."""
        from sluice.kernels.w4a16_layout import W4A16Weight  # imports Triton: only where a 4-bit model runs

        return W4A16Weight(self.qweight, self.scales, self.zeros, self.perm)


def as_w4a16_linears(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """In place, before the state is loaded: each nn.Linear whose weight the state holds in 4 bits (name.qweight)
    becomes a W4A16Linear of the state's shapes on the same device."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and f"{name}.qweight" in state:
            groups = state[f"{name}.scales"].shape[0]
            model.set_submodule(name, W4A16Linear(module.in_features, module.out_features, groups,
                                                  f"{name}.zeros" in state, f"{name}.perm" in state,
                                                  module.bias is not None, module.weight.device))
