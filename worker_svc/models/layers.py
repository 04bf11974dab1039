"""The layers every decoder shares: its projections, RMSNorm and the gated MLP."""
import torch
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.fp8 import Fp8Linear


def linear_layer(config: ModelConfig, in_features: int, out_features: int, bias: bool = False) -> nn.Module:
    """A decoder layer's projection: FP8 weights when the model is quantized, else the model dtype's."""
    if config.quantization == "fp8":
        return Fp8Linear(in_features, out_features, bias)
    return nn.Linear(in_features, out_features, bias=bias)


class RMSNorm(nn.Module):
    gemma_norm = False  # the ops' gemma_norm: Gemma's x * (1 + weight) in float32, rounded once

    def __init__(self, size: int, eps: float, ops):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual), or with residual None (norm(x), x)."""
        if residual is None:
            return self.ops.rms_norm(x, self.weight, self.eps, self.gemma_norm), x
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps, self.gemma_norm)

    def project(self, x: torch.Tensor, residual: torch.Tensor | None, linear: nn.Module, gated: bool = False,
                out_dtype: torch.dtype | None = None, activation: str = "silu") -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(norm(x + residual)), x + residual): the norm with the projection that reads it (residual None: x
        alone); `gated` applies the MLP's activation(gate) * up to the projection."""
        return self.ops.norm_linear(x, residual, self.weight, self.eps, linear, gated, out_dtype, self.gemma_norm,
                                    activation)


class MLP(nn.Module):
    """The gated MLP; the norm in front of it applies gate_up_proj and the gate (RMSNorm.project)."""

    activation = "silu"  # the gate's, of kernels.activation

    def __init__(self, config: ModelConfig, ops):
        super().__init__()
        self.gate_up_proj = linear_layer(config, config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = linear_layer(config, config.intermediate_size, config.hidden_size)
        self.ops = ops

    def forward(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the MLP of norm(x + residual), x + residual)."""
        gated, residual = norm.project(x, residual, self.gate_up_proj, gated=True, activation=self.activation)
        return self.down(gated), residual

    def down(self, gated: torch.Tensor) -> torch.Tensor:
        return self.ops.linear(gated, self.down_proj)
