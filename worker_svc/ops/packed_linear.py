"""Projections on the CPU through oneDNN's inner product, each weight packed once at load into the blocked layout
oneDNN's kernels read.

NOTE: F.linear runs float32 on the CPU through MKL's sgemm, which on AMD CPUs takes a generic path. On this
repository's 2-core AMD EPYC (AVX-512, AVX512-BF16), one thread, [M, 576] x [576, 1728] (SmolLM2-135M's q/k/v):
MKL 0.059 / 0.239 / 0.762 / 10.37 ms at M = 1 / 5 / 32 / 512, oneDNN packed 0.061 / 0.069 / 0.321 / 4.46 ms; bfloat16
0.074 / 0.088 / 0.206 / 2.42 ms against 0.039 / 0.043 / 0.173 / 2.34 ms. Both accumulate in float32 (their largest
difference from a float64 product of 576 unit normals: 4e-5 and 8e-5), and oneDNN's rows do not depend on M."""
import torch
from torch import nn

PACKED_DTYPES = (torch.float32, torch.bfloat16)


class PackedLinear(nn.Module):
    """An nn.Linear whose weight is held packed for oneDNN (an opaque mkldnn tensor, not a parameter)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.bias = linear.bias

    @property
    def weight(self) -> torch.Tensor:
        """The weight unpacked, [out_features, in_features] (a copy)."""
        return self.packed_weight.to_dense()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """The state dict names the weight as nn.Linear's does, unpacked."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., in_features] -> [..., out_features]
        rows = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def packs_linears(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a model of this dtype on this device runs its projections packed: on the CPU, where torch has
    oneDNN (and, for bfloat16, the CPU has bfloat16 instructions)."""
    if device.type != "cpu" or dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_linears(model: nn.Module) -> None:
    """In place: every nn.Linear of the model whose weight is float32 or bfloat16 becomes a PackedLinear (a tied
    LM head packs a copy; the embedding keeps its weight)."""
    linears = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and module.weight.dtype in PACKED_DTYPES]
    for name, linear in linears:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, PackedLinear(linear))
