"""A tensor-parallel rank's part of the decoder: the plain modules over the rank's shards (shard_layout.py), plus one
all-reduce after attention, one after the MLP, one in the vocabulary-parallel embedding, and the logits gathered
to the driver rank, which samples."""
import torch
import torch.nn.functional as F
from torch import nn

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.decoder import Attention, DecoderLM
from sluice.worker.models.layers import MLP, RMSNorm
from sluice.worker.models.moe import SparseMoeBlock
from sluice.worker.models.registry import ArchitectureTraits
from sluice.worker.models.shard_layout import ShardLayout
from sluice.worker.parallel.group import TensorParallelGroup


class VocabParallelEmbedding(nn.Embedding):
    """Rows [vocab_start, vocab_start + rows) of the embedding; ids outside them look up zeros, and the ranks'
    lookups are summed."""

    def __init__(self, rows: int, hidden_size: int, vocab_start: int, group: TensorParallelGroup):
        super().__init__(rows, hidden_size)
        self.vocab_start = vocab_start
        self.group = group

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill_(outside[:, None], 0)
        return self.group.all_reduce(x)


class RowParallelAttention(Attention):
    """The rank's q and KV heads; o_proj reads the rank's heads only, so its partial outputs are summed. A norm of
    the whole q or k projection sums its squares over the ranks."""

    def __init__(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int, group: TensorParallelGroup):
        super().__init__(config, traits, ops, layer)
        self.group = group

    def forward(self, qkv, positions, cos_sin_cache, kv_cache, meta):
        return self.group.all_reduce(super().forward(qkv, positions, cos_sin_cache, kv_cache, meta))

    def _projection_norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        x32 = x.float()
        mean_square = self.group.all_reduce(x32.pow(2).sum(-1, keepdim=True)) / (x.shape[-1] * self.group.world_size)
        return norm.weight * (x32 * torch.rsqrt(mean_square + norm.eps)).to(x.dtype)


class RowParallelMLP(MLP):
    """The rank's columns of the intermediate size; down_proj's partial outputs are summed."""

    def __init__(self, config: ModelConfig, ops, group: TensorParallelGroup):
        super().__init__(config, ops)
        self.group = group

    def down(self, gated: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(super().down(gated))


class RowParallelMoeBlock(SparseMoeBlock):
    """The rank's experts, or its columns of every expert's intermediate size, and of the shared expert's: the
    partial outputs are summed."""

    def __init__(self, config: ModelConfig, ops, experts: range, group: TensorParallelGroup):
        super().__init__(config, ops, experts)
        self.group = group

    def reduce(self, out: torch.Tensor) -> torch.Tensor:
        return self.group.all_reduce(out)


class TensorParallelDecoderLM(DecoderLM):
    """config: the rank's local shape (ShardLayout.local_config). Logits come back whole on the driver, and as the
    rank's own vocabulary columns elsewhere."""

    def __init__(self, layout: ShardLayout, traits: ArchitectureTraits, ops, group: TensorParallelGroup):
        self.layout = layout
        self.group = group
        super().__init__(layout.local_config(), traits, ops)

    def logits(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        logits = self.group.gather_to_driver(super().logits(x, residual))
        return logits[:, :self.layout.config.vocab_size] if self.group.is_driver else logits

    def _embedding(self, config: ModelConfig) -> nn.Embedding:
        return VocabParallelEmbedding(config.vocab_size, config.hidden_size, self.layout.vocab.start, self.group)

    def _attention(self, config: ModelConfig, traits: ArchitectureTraits, ops, layer: int) -> Attention:
        return RowParallelAttention(config, traits, ops, layer, self.group)

    def _mlp(self, config: ModelConfig, layer: int, ops) -> nn.Module:
        if config.has_experts(layer):
            return RowParallelMoeBlock(config, ops, self.layout.experts, self.group)
        return RowParallelMLP(config, ops, self.group)
