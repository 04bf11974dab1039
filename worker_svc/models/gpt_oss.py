"""gpt-oss (GptOssForCausalLM): the Llama-family decoder with biased attention projections and attention sinks
(registry traits), sliding and full layers alternating as layer_types say, YaRN rope, and in every layer a mixture
of experts of its own: a biased router, and experts with biases and a clamped SwiGLU (ops.biased_experts). In an FP8
model the attention projections and the experts are e4m3 with a scale per row, their biases in the model dtype, as
the other families quantize theirs; the router stays in the model dtype and the sinks in float32."""
import torch
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.decoder import DecoderLM
from sluice.worker.models.layers import RMSNorm
from sluice.worker.models.moe import Experts
from sluice.worker.models.tensor_parallel import TensorParallelDecoderLM
from sluice.worker.parallel.group import TensorParallelGroup


class GptOssMoeBlock(nn.Module):
    """config: the (rank's) shape, whose moe holds the experts' (rank's) intermediate size."""

    def __init__(self, config: ModelConfig, ops):
        super().__init__()
        moe = config.moe
        self.top_k, self.activation = moe.top_k, moe.clamped_swiglu
        self.router = nn.Linear(config.hidden_size, moe.num_experts, bias=True)
        self.experts = Experts(moe.num_experts, moe.intermediate_size, config.hidden_size,
                               config.quantization == "fp8", bias=True)
        self.ops = ops

    def forward(self, norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the experts' weighted sum for norm(x + residual), x + residual)."""
        h, residual = norm(x, residual)  # h: [num_tokens, hidden]
        # the softmax of the top-k logits: the top k of the softmax over all experts, renormalized
        weights, expert_ids = self.ops.route_tokens(self.ops.linear(h, self.router), self.top_k, renormalize=True)
        out = self.ops.biased_experts(h, weights, expert_ids, self.experts, self.activation.alpha,
                                      self.activation.limit)
        return self.reduce(out), residual

    def reduce(self, out: torch.Tensor) -> torch.Tensor:
        """The layer's output from this rank's part of it (a tensor-parallel rank's sums them over the ranks)."""
        return out


class RowParallelGptOssMoeBlock(GptOssMoeBlock):
    """The rank's columns of every expert's intermediate size, the down biases on the first rank only (zeros on the
    others, shard_layout.py): the partial outputs are summed."""

    def __init__(self, config: ModelConfig, ops, group: TensorParallelGroup):
        super().__init__(config, ops)
        self.group = group

    def reduce(self, out: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(out)


class GptOssLM(DecoderLM):
    def _mlp(self, config: ModelConfig, layer: int, ops) -> nn.Module:
        return GptOssMoeBlock(config, ops)


class TensorParallelGptOssLM(TensorParallelDecoderLM):
    def _mlp(self, config: ModelConfig, layer: int, ops) -> nn.Module:
        return RowParallelGptOssMoeBlock(config, ops, self.group)
