"""4-bit linear layers (W4A16): int4 weights in kernels.w4a16_layout's layout, activations in the model dtype.

A pre-quantized GPTQ, AWQ or compressed-tensors checkpoint's projections arrive in the worker's state converted
(loading/w4a16_checkpoint.py) as name.qweight, .scales and, where the checkpoint has them, .zeros (asymmetric) and
.perm (act-order) or, on a tensor-parallel rank's share of an act-order projection's inputs, .group_index;
as_w4a16_linears swaps the model's nn.Linear for a W4A16Linear of the same tensors before the state is loaded.
TorchOps dequantizes and multiplies (w4a16_linear_ref), TritonOps runs w4a16_linear.

A mixture's experts arrive stacked (loading/weights.stack_experts) as mlp.experts.w13.qweight, .scales, .zeros, .perm,
.group_index and w2's alike; as_w4a16_experts swaps the experts' w13 and w2 for W4A16ExpertWeights. TorchOps
dequantizes an expert at a time, TritonOps runs the fused MoE kernels on the stacks.
"""
import functools

import torch
from torch import nn


class W4A16Linear(nn.Module):
    """The tensors of a W4A16Weight (see kernels.w4a16_layout) as buffers, and the float bias."""

    def __init__(self, in_features: int, out_features: int, groups: int, zeros: bool, perm: bool,
                 group_index: bool = False, bias: bool = False, device: torch.device | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("qweight", torch.empty(in_features // 8, out_features, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.empty(groups, out_features, device=device))
        self.register_buffer("zeros", torch.empty(groups, out_features, dtype=torch.uint8, device=device)
                             if zeros else None)
        self.register_buffer("perm", torch.empty(in_features, dtype=torch.int32, device=device) if perm else None)
        self.register_buffer("group_index", torch.empty(in_features, dtype=torch.int32, device=device)
                             if group_index else None)
        self.bias = nn.Parameter(torch.empty(out_features, device=device), requires_grad=False) if bias else None

    @functools.cached_property
    def w4a16(self):
        """The layer's weight as the kernels take it (a W4A16Weight, checked once: the buffers are set at load and
        never replaced), so a step's linears pay no checks."""
        from sluice.kernels.w4a16_layout import W4A16Weight  # imports Triton: only where a 4-bit model runs

        return W4A16Weight(self.qweight, self.scales, self.zeros, self.perm, self.group_index)


def as_w4a16_linears(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """In place, before the state is loaded: each nn.Linear whose weight the state holds in 4 bits (name.qweight)
    becomes a W4A16Linear of the state's shapes on the same device."""
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and f"{name}.qweight" in state:
            groups = state[f"{name}.scales"].shape[0]
            model.set_submodule(name, W4A16Linear(module.in_features, module.out_features, groups,
                                                  f"{name}.zeros" in state, f"{name}.perm" in state,
                                                  f"{name}.group_index" in state, module.bias is not None,
                                                  module.weight.device))


class W4A16ExpertWeights(nn.Module):
    """One projection of a mixture's experts in 4 bits: a kernels.w4a16_layout.W4A16Stack's tensors as buffers,
    qweight [E, K / 8, N], scales [E, groups, N], zeros (or None) and perm or group_index [E, K] (act-order, or
    None)."""

    def __init__(self, num_experts: int, in_features: int, out_features: int, groups: int, zeros: bool, perm: bool,
                 group_index: bool = False, device: torch.device | None = None):
        super().__init__()
        self.register_buffer("qweight", torch.empty(num_experts, in_features // 8, out_features, dtype=torch.int32,
                                                    device=device))
        self.register_buffer("scales", torch.empty(num_experts, groups, out_features, device=device))
        self.register_buffer("zeros", torch.empty(num_experts, groups, out_features, dtype=torch.uint8, device=device)
                             if zeros else None)
        for name, present in (("perm", perm), ("group_index", group_index)):
            self.register_buffer(name, torch.empty(num_experts, in_features, dtype=torch.int32, device=device)
                                 if present else None)

    @functools.cached_property
    def w4a16(self):
        """The stack as the kernels take it (checked once, as W4A16Linear.w4a16)."""
        from sluice.kernels.w4a16_layout import W4A16Stack  # imports Triton: only where a 4-bit model runs

        return W4A16Stack(self.qweight, self.scales, self.zeros, self.perm, self.group_index)


def as_w4a16_experts(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """In place, before the state is loaded: the stacked experts (w13 [E, 2I, H] and w2 [E, H, I]) whose weights the
    state holds in 4 bits (name.w13.qweight) get W4A16ExpertWeights of the state's groups on the same device."""
    for name, module in list(model.named_modules()):
        if f"{name}.w13.qweight" not in state:
            continue
        for part in ("w13", "w2"):
            num_experts, out_features, in_features = getattr(module, part).shape
            device = getattr(module, part).device
            delattr(module, part)
            setattr(module, part, W4A16ExpertWeights(num_experts, in_features, out_features,
                                                     state[f"{name}.{part}.scales"].shape[1],
                                                     f"{name}.{part}.zeros" in state, f"{name}.{part}.perm" in state,
                                                     f"{name}.{part}.group_index" in state, device))


def kernel_expert_weights(weights: torch.Tensor | W4A16ExpertWeights):
    """Stacked experts' weights as the fused MoE kernels take them: a tensor, or a W4A16Stack."""
    return weights.w4a16 if isinstance(weights, W4A16ExpertWeights) else weights
