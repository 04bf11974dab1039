"""The mixture-of-experts layer (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE): a router picks each token's top-k experts,
and the experts run as one fused operator (ops.route_tokens, ops.fused_experts) over weights stacked per expert."""
import dataclasses

import torch
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.layers import MLP, RMSNorm


class Experts(nn.Module):
    """The layer's experts' weights, stacked: w13 [num_experts, 2 * intermediate, hidden], each expert's gate rows
    then its up rows, and w2 [num_experts, hidden, intermediate], its down projection."""

    def __init__(self, num_experts: int, intermediate_size: int, hidden_size: int):
        super().__init__()
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))


class SparseMoeBlock(nn.Module):
    """config: the (rank's) shape, whose moe holds the experts' (rank's) intermediate size; experts: the experts this
    rank holds, in order (all of them but under expert parallelism). Every token's hidden state goes to the top_k
    experts its router weighs highest; a shared expert, where the family has one, runs for every token, scaled by its
    sigmoid gate."""

    def __init__(self, config: ModelConfig, ops, experts: range | None = None):
        super().__init__()
        moe = config.moe
        experts = experts or range(moe.num_experts)
        self.top_k, self.renormalize = moe.top_k, moe.renormalize
        self.gate = nn.Linear(config.hidden_size, moe.num_experts, bias=False)  # the router
        self.experts = Experts(len(experts), moe.intermediate_size, config.hidden_size)
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            shared = dataclasses.replace(config, intermediate_size=moe.shared_expert_intermediate_size)
            self.shared_expert = MLP(shared, ops)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)
        # global expert id -> its index in w13 and w2, or -1 (another rank's); None where this rank holds every expert
        partial = len(experts) < moe.num_experts
        self.register_buffer("expert_map", torch.empty(moe.num_experts, dtype=torch.int32) if partial else None)
        self.ops = ops

    def forward(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the experts' weighted sum for norm(x + residual), x + residual)."""
        h, residual = norm(x, residual)  # h: [num_tokens, hidden]
        weights, expert_ids = self.ops.route_tokens(self.ops.linear(h, self.gate), self.top_k, self.renormalize)
        out = self.ops.fused_experts(h, weights, expert_ids, self.experts.w13, self.experts.w2, self.expert_map)
        if self.shared_expert is not None:
            shared = self.shared_expert.down(self.ops.silu_and_mul(self.ops.linear(h, self.shared_expert.gate_up_proj)))
            out = out + torch.sigmoid(self.ops.linear(h, self.shared_expert_gate)) * shared
        return self.reduce(out), residual

    def reduce(self, out: torch.Tensor) -> torch.Tensor:
        """The layer's output from this rank's part of it (a tensor-parallel rank's sums them over the ranks)."""
        return out

