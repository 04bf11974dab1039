"""A vision tower's block: attention among the patches of a window (or of a whole image frame) with 2-D rotary
positions, then a gated MLP, each behind an RMSNorm, as transformers' Qwen2.5-VL computes them."""
import torch
import torch.nn.functional as F
from torch import nn

from sluice.worker.models.layers import RMSNorm
from sluice.worker.models.vision.config import VisionConfig

NORM_EPS = 1e-6  # transformers' Qwen2.5-VL tower fixes its norms' eps


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig, ops):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=True)
        self.ops = ops

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
        """x [num_patches, hidden]; cos_sin [num_patches, head_dim]: each patch's rotary row; bounds: the segments
        (windows or frames) whose patches attend to each other."""
        qkv = self.ops.linear(x, self.qkv).view(-1, 3 * self.num_heads, self.head_dim)
        rows = torch.arange(len(x), device=x.device)
        q, k, v = self.ops.rotated_qkv(qkv, rows, cos_sin, None, None, 0.0, self.num_heads)
        out = self.ops.segment_attention(q, k, v, bounds, self.head_dim**-0.5)
        return self.ops.linear(out.reshape(len(x), -1), self.proj)


class VisionMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), every projection biased."""

    def __init__(self, config: VisionConfig, ops):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gated = F.silu(self.ops.linear(x, self.gate_proj)) * self.ops.linear(x, self.up_proj)
        return self.ops.linear(gated, self.down_proj)


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig, ops):
        super().__init__()
        self.norm1 = RMSNorm(config.hidden_size, NORM_EPS, ops)
        self.attn = VisionAttention(config, ops)
        self.norm2 = RMSNorm(config.hidden_size, NORM_EPS, ops)
        self.mlp = VisionMLP(config, ops)

    def forward(self, x: torch.Tensor, cos_sin: torch.Tensor, bounds: torch.Tensor) -> torch.Tensor:
        h, residual = self.norm1(x, None)
        h, residual = self.norm2(self.attn(h, cos_sin, bounds), residual)
        return residual + self.mlp(h)
