"""gpt-oss's experts in plain torch, as transformers computes them: biased projections and a clamped SwiGLU; TorchOps'
(the fused MoE kernels compute them for TritonOps)."""
import torch
import torch.nn.functional as F


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit); gate_up: [..., 2 *
    intermediate], the gate's columns then the up's."""
    gate, up = gate_up.chunk(2, dim=-1)
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def biased_experts(x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor, w13: torch.Tensor,
                   w13_bias: torch.Tensor, w2: torch.Tensor, w2_bias: torch.Tensor,
                   alpha: float, limit: float) -> torch.Tensor:
    """sum over k of weights[t, k] * expert(x[t]) for each token t, where expert e computes
    w2[e] @ clamped_swiglu(w13[e] @ x + w13_bias[e]) + w2_bias[e]. Expert by expert, as transformers computes it."""
    out = torch.zeros_like(x)
    expert_ids = expert_ids.long()
    for expert in torch.unique(expert_ids).tolist():
        token, slot = torch.where(expert_ids == expert)
        gated = clamped_swiglu(F.linear(x[token], w13[expert], w13_bias[expert]), alpha, limit)
        expert_out = F.linear(gated, w2[expert], w2_bias[expert]) * weights[token, slot, None]
        out.index_add_(0, token, expert_out.to(x.dtype))
    return out
