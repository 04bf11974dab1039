"""The mixture-of-experts layer (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE): a router picks each token's top-k experts,
and the experts run as one fused operator (ops.route_tokens, ops.fused_experts) over weights stacked per expert.

In an FP8 model the experts are e4m3, with a float32 scale per row as fp8.Fp8Linear's weights, or per block as a
block-wise checkpoint stores them, and a shared expert is a dense MLP of Fp8Linear layers. The router and a shared
expert's gate stay in the model dtype, as vLLM keeps them (quant_config=None) and FP8 checkpoints store them. In a 4-bit
model (GPTQ, AWQ, compressed-tensors) the experts' w13 and w2 become ops.w4a16.W4A16ExpertWeights at load
(as_w4a16_experts), a shared expert's linears W4A16Linear, and the router stays in the model dtype."""
import dataclasses

import torch
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.layers import MLP, RMSNorm
from sluice.worker.ops.fp8 import FP8


class Experts(nn.Module):
    """The layer's experts' weights, stacked: w13 [num_experts, 2 * intermediate, hidden], each expert's gate rows
    then its up rows, and w2 [num_experts, hidden, intermediate], its down projection. Quantized: both e4m3 with
    float32 scales, w13_scale [num_experts, 2 * intermediate] and w2_scale [num_experts, hidden], one a row, or with
    block_shape (rows, columns) one a block, w13_scale [num_experts, 2 * intermediate / rows, ceil(hidden / columns)]
    and w2_scale [num_experts, ceil(hidden / rows), ceil(intermediate / columns)]; else the scales are None. Biased
    (gpt-oss): w13_bias [num_experts, 2 * intermediate] and w2_bias [num_experts, hidden] in the model dtype, added to
    the (scaled) products; else the biases are None."""

    def __init__(self, num_experts: int, intermediate_size: int, hidden_size: int, quantized: bool = False,
                 block_shape: tuple[int, int] | None = None, bias: bool = False):
        super().__init__()
        dtype = FP8 if quantized else None
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype),
                               requires_grad=False)
        self.block_shape = block_shape if quantized else None
        self.w13_scale = _scales(self.w13, self.block_shape) if quantized else None
        self.w2_scale = _scales(self.w2, self.block_shape) if quantized else None
        self.w13_bias = _biases(self.w13) if bias else None
        self.w2_bias = _biases(self.w2) if bias else None


def _scales(weight: nn.Parameter, block_shape: tuple[int, int] | None) -> nn.Parameter:
    num_experts, rows, columns = weight.shape
    shape = (num_experts, rows) if block_shape is None else \
        (num_experts, -(-rows // block_shape[0]), -(-columns // block_shape[1]))
    return nn.Parameter(torch.empty(shape, dtype=torch.float32), requires_grad=False)


def _biases(weight: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(torch.empty(weight.shape[:2]), requires_grad=False)


def keep_stored_expert_precision(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """In place, before the state is loaded: FP8 experts whose weights the state holds unquantized (a pre-quantized
    checkpoint's ignore list named them) become unquantized experts, as fp8.keep_stored_precision does for linear
    layers."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Experts) and module.w13_scale is not None and state[f"{name}.w13"].dtype != FP8:
            num_experts, hidden_size, intermediate_size = module.w2.shape
            with module.w13.device:
                model.set_submodule(name, Experts(num_experts, intermediate_size, hidden_size,
                                                  bias=module.w13_bias is not None))


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
        self.experts = Experts(len(experts), moe.intermediate_size, config.hidden_size, config.quantization == "fp8",
                               config.expert_weight_block)
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
        out = self.ops.fused_experts(h, weights, expert_ids, self.experts, self.expert_map)
        if self.shared_expert is not None:
            shared = self.shared_expert.down(self.ops.silu_and_mul(self.ops.linear(h, self.shared_expert.gate_up_proj)))
            out = out + torch.sigmoid(self.ops.linear(h, self.shared_expert_gate)) * shared
        return self.reduce(out), residual

    def reduce(self, out: torch.Tensor) -> torch.Tensor:
        """The layer's output from this rank's part of it (a tensor-parallel rank's sums them over the ranks)."""
        return out

