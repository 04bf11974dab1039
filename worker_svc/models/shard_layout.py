"""Which slice of every weight one tensor-parallel rank holds (Megatron-style).

Column-parallel (output rows split): q/k/v by heads, gate/up by the intermediate size, the embedding and the LM head by
vocabulary; a projection the checkpoint publishes fused (Phi-3's qkv_proj and gate_up_proj) as each of its parts, the
rank's q, k and v rows (gate and up rows) in order. Row-parallel (input columns split): o by q heads, down by the
intermediate size. An FP8 weight's scale, one per output row, is split with a column-parallel weight's rows and kept
whole with a row-parallel one. Norms are replicated (q/k norms are per head_dim, so every rank's heads share them), but
for norms of a whole q or k projection, split with its heads. With fewer KV heads than ranks, each KV head is replicated
on the ranks whose q heads read it. A mixture of experts splits every expert's intermediate size as the MLP's, or under
expert parallelism places whole experts on the ranks; the router is replicated, a shared expert split as the MLP.
Experts in FP8 blocks keep them, so a rank's intermediate columns must be whole blocks, and their block scales are split
with them. Stacked experts (gpt-oss) split their interleaved gate/up columns in pairs, and attention sinks go with their
heads. A row-parallel bias (o_proj's and the stacked experts' down bias) is added once: the first rank holds it, the
others an empty slice padded with zeros. A vision tower is whole on every rank.
"""
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sluice.worker.models.config import ModelConfig
from sluice.worker.models.registry import traits_for

_Q_ROWS = ("self_attn.q_proj.weight", "self_attn.q_proj.bias")
_KV_ROWS = ("self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias")
_INTERMEDIATE_ROWS = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
_VOCAB_ROWS = ("embed_tokens.weight", "lm_head.weight")
_SHARED_EXPERT_ROWS = ("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight")
_EXPERT = re.compile(r"\.experts\.(\d+)\.(\w+)\.(?:weight|weight_scale|input_scale)$")  # an expert's tensors
_REPLICATED = ("visual.",)  # a vision-language model's vision tower
_ADDED_ONCE = {"self_attn.o_proj.bias": 0, "mlp.experts.down_proj_bias": 1}  # row-parallel biases: their hidden dim
FUSED_PROJECTIONS = {  # the worker's fused projections, and their parts as checkpoints publish them apart
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.shared_expert.gate_up_proj": ("mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj"),
}
_FUSED_KINDS = (".weight", ".weight_scale", ".bias")


@dataclass(slots=True, frozen=True)
class ShardSlice:
    dim: int
    start: int
    stop: int
    padded_size: int  # the shard's size along dim, zero rows appended past the end of an uneven split


@dataclass(slots=True, frozen=True)
class ShardLayout:
    config: ModelConfig  # the whole model's
    rank: int = 0
    world_size: int = 1
    expert_parallel: bool = False  # a mixture's whole experts on each rank, not every expert's intermediate columns

    def __post_init__(self):
        heads, kv_heads, size = self.config.num_heads, self.config.num_kv_heads, self.world_size
        if heads % size:
            raise ValueError(f"tensor_parallel_size {size} does not divide the {heads} attention heads")
        if kv_heads % size and size % kv_heads:
            raise ValueError(f"tensor_parallel_size {size} neither divides nor is a multiple of the {kv_heads} KV "
                             "heads")
        if self.expert_parallel and self.config.moe is not None and self.config.moe.num_experts % size:
            raise ValueError(f"tensor_parallel_size {size} does not divide the {self.config.moe.num_experts} "
                             "experts for expert parallelism")
        if self.expert_parallel and traits_for(self.config.architecture).stacked_experts and size > 1:
            raise ValueError(f"expert parallelism is not implemented for {self.config.architecture}'s stacked experts: "
                             "serve it with its experts' intermediate columns split over the ranks")
        if traits_for(self.config.architecture).qk_projection_norm and kv_heads % size:
            raise ValueError(f"the q/k norms of {self.config.architecture} span all heads: tensor_parallel_size "
                             f"{size} must divide the {kv_heads} KV heads")

    @property
    def q_heads(self) -> range:
        per_rank = self.config.num_heads // self.world_size
        return range(self.rank * per_rank, (self.rank + 1) * per_rank)

    @property
    def kv_heads(self) -> range:
        """The KV heads the rank's q heads read (one, shared with other ranks, when KV heads are fewer than ranks)."""
        group = self.config.num_heads // self.config.num_kv_heads
        return range(self.q_heads.start // group, (self.q_heads.stop - 1) // group + 1)

    @property
    def intermediate(self) -> range:
        return _split(self.config.intermediate_size, self.rank, self.world_size)

    @property
    def experts(self) -> range:
        """The experts whose weights the rank holds: all, but for expert parallelism."""
        num_experts = self.config.moe.num_experts
        if not self.expert_parallel:
            return range(num_experts)
        per_rank = num_experts // self.world_size
        return range(self.rank * per_rank, (self.rank + 1) * per_rank)

    @property
    def expert_intermediate(self) -> range:
        """Each held expert's intermediate columns: all of them under expert parallelism."""
        return _split(self.config.moe.intermediate_size, 0 if self.expert_parallel else self.rank,
                      1 if self.expert_parallel else self.world_size)

    @property
    def shared_expert_intermediate(self) -> range:
        return _split(self.config.moe.shared_expert_intermediate_size, self.rank, self.world_size)

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.config.vocab_size // self.world_size)

    @property
    def vocab(self) -> range:
        start = self.rank * self.vocab_per_rank
        return range(start, min(start + self.vocab_per_rank, self.config.vocab_size))

    def local_config(self) -> ModelConfig:
        """The shape of the rank's part of the model (the whole model at world size 1)."""
        moe = self.config.moe
        if moe is not None:
            moe = dataclasses.replace(moe, intermediate_size=len(self.expert_intermediate),
                                      shared_expert_intermediate_size=len(self.shared_expert_intermediate))
        return dataclasses.replace(self.config, num_heads=len(self.q_heads), num_kv_heads=len(self.kv_heads),
                                   intermediate_size=len(self.intermediate), vocab_size=self.vocab_per_rank, moe=moe)

    def check_expert_blocks(self, block: tuple[int, int]) -> None:
        """Experts in FP8 blocks of (rows, columns) keep them: the rank's columns of every expert's intermediate size
        must be whole blocks of both."""
        if self.config.moe is None:
            return
        part = self.expert_intermediate
        if any(part.start % size or part.stop % size for size in block):
            split = len(part) < self.config.moe.intermediate_size
            hint = " (--enable-expert-parallel places whole experts on the ranks)" if split else ""
            raise ValueError(f"rank {self.rank} of {self.world_size} would hold columns {part.start}-{part.stop} of "
                             f"the experts' {self.config.moe.intermediate_size} intermediate ones, not whole FP8 "
                             f"weight blocks of {block[0]} x {block[1]}{hint}")

    def is_expert(self, name: str) -> bool:
        return _EXPERT.search(name) is not None

    def holds(self, name: str) -> bool:
        """Whether the rank holds any of a Hugging Face-named weight (under expert parallelism, only its experts')."""
        expert = _EXPERT.search(name)
        return expert is None or int(expert.group(1)) in self.experts

    def pieces_of(self, name: str) -> tuple[ShardSlice, ...] | None:
        """The rank's slices of a Hugging Face-named weight, in order: one, or for a projection the checkpoint
        publishes fused, one per part (q, k, v or gate, up); None if every rank holds all of it."""
        if self.world_size == 1:
            return None
        parts = self._fused_parts(name)
        if parts is None:
            piece = self.slice_of(name)
            return None if piece is None else (piece,)
        pieces, first_row = [], 0
        for part, rows in parts:
            piece = self.slice_of(part)
            pieces.append(dataclasses.replace(piece, start=first_row + piece.start, stop=first_row + piece.stop))
            first_row += rows
        return tuple(pieces)

    def _fused_parts(self, name: str) -> list[tuple[str, int]] | None:
        """Each part of a projection the checkpoint publishes fused (of its weight, scale or bias): its name as
        published apart, and its rows in the whole model. None for another weight."""
        for fused, parts in FUSED_PROJECTIONS.items():
            for kind in _FUSED_KINDS:
                if name.endswith(f".{fused}{kind}"):
                    prefix = name.removesuffix(f"{fused}{kind}")
                    return [(f"{prefix}{part}{kind}", self._part_rows(part)) for part in parts]
        return None

    def _part_rows(self, part: str) -> int:
        """The rows of one part of a fused projection in the whole model."""
        config = self.config
        q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        if part.startswith("self_attn."):
            return q_rows if part == "self_attn.q_proj" else kv_rows
        if part.startswith("mlp.shared_expert."):
            return config.moe.shared_expert_intermediate_size
        return config.intermediate_size

    def slice_of(self, name: str) -> ShardSlice | None:
        """The rank's slice of a Hugging Face-named weight; None if every rank holds all of it."""
        if self.world_size == 1 or name.startswith(_REPLICATED):
            return None
        if name.endswith(".weight_scale"):
            rows = self.slice_of(name.removesuffix("_scale"))
            return rows if rows is not None and rows.dim == 0 else None
        head_dim = self.config.head_dim
        expert = _EXPERT.search(name)
        if expert is not None:
            return self._expert_slice(expert.group(2))
        added_once = next((dim for suffix, dim in _ADDED_ONCE.items() if name.endswith(suffix)), None)
        if added_once is not None:
            return None if self.rank == 0 else ShardSlice(added_once, 0, 0, self.config.hidden_size)
        if ".mlp.experts." in name and traits_for(self.config.architecture).stacked_experts:
            return self._stacked_expert_slice(name)
        if name.endswith("self_attn.sinks"):
            return _rows(self.q_heads)
        if name.endswith(_SHARED_EXPERT_ROWS):
            return _rows(self.shared_expert_intermediate)
        if name.endswith("shared_expert.down_proj.weight"):
            return _columns(self.shared_expert_intermediate)
        if traits_for(self.config.architecture).qk_projection_norm and name.endswith("self_attn.q_norm.weight"):
            return _rows(self.q_heads, head_dim)
        if traits_for(self.config.architecture).qk_projection_norm and name.endswith("self_attn.k_norm.weight"):
            return _rows(self.kv_heads, head_dim)
        if name.endswith(_Q_ROWS):
            return _rows(self.q_heads, head_dim)
        if name.endswith(_KV_ROWS):
            return _rows(self.kv_heads, head_dim)
        if name.endswith("self_attn.o_proj.weight"):
            return _columns(self.q_heads, head_dim)
        if name.endswith(_INTERMEDIATE_ROWS):
            return _rows(self.intermediate)
        if name.endswith("mlp.down_proj.weight"):
            return _columns(self.intermediate)
        if name.endswith(_VOCAB_ROWS):
            return ShardSlice(0, self.vocab.start, self.vocab.stop, self.vocab_per_rank)
        return None

    def _expert_slice(self, projection: str) -> ShardSlice | None:
        """An expert's gate and up rows, or its down columns, of the rank's intermediate columns."""
        if self.expert_parallel:
            return None
        down = traits_for(self.config.architecture).expert_projections[2]
        return _columns(self.expert_intermediate) if projection == down else _rows(self.expert_intermediate)

    def _stacked_expert_slice(self, name: str) -> ShardSlice:
        """gate_up_proj [experts, hidden, 2 * intermediate] and its bias [experts, 2 * intermediate], gate and up
        columns interleaved: the pairs of the rank's intermediate columns; down_proj [experts, intermediate, hidden]:
        the rank's rows."""
        columns = self.expert_intermediate
        if name.endswith("gate_up_proj"):
            return ShardSlice(2, 2 * columns.start, 2 * columns.stop, 2 * len(columns))
        if name.endswith("gate_up_proj_bias"):
            return ShardSlice(1, 2 * columns.start, 2 * columns.stop, 2 * len(columns))
        return _columns(columns)

    def shard_block_scale(self, name: str, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
        """The scales of the rank's blocks of a block-wise weight, whose slice check_expert_blocks found whole blocks;
        scale: [ceil(rows / block rows), ceil(columns / block columns)]."""
        piece = self.slice_of(name)
        if piece is None:
            return scale
        size = block[piece.dim]
        return scale.narrow(piece.dim, piece.start // size, -(-(piece.stop - piece.start) // size)).clone()

    def shard(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """The rank's part of a whole weight, as its own tensor."""
        pieces = self.pieces_of(name)
        if pieces is None:
            return tensor
        return gather_pieces(lambda piece: tensor.narrow(piece.dim, piece.start, piece.stop - piece.start).clone(),
                             pieces)


def _split(size: int, rank: int, world_size: int) -> range:
    return range(rank * size // world_size, (rank + 1) * size // world_size)


def gather_pieces(read: Callable[[ShardSlice], torch.Tensor], pieces: tuple[ShardSlice, ...]) -> torch.Tensor:
    """The rank's shard of a weight: its pieces, each read and padded, joined along their dim."""
    shards = [pad_shard(read(piece), piece) for piece in pieces]
    return shards[0] if len(shards) == 1 else torch.cat(shards, dim=pieces[0].dim)


def pad_shard(tensor: torch.Tensor, piece: ShardSlice) -> torch.Tensor:
    missing = piece.padded_size - tensor.shape[piece.dim]
    if not missing:
        return tensor
    padding = list(tensor.shape)
    padding[piece.dim] = missing
    return torch.cat([tensor, tensor.new_zeros(padding)], dim=piece.dim)


def _rows(part: range, unit: int = 1) -> ShardSlice:
    return ShardSlice(0, part.start * unit, part.stop * unit, len(part) * unit)


def _columns(part: range, unit: int = 1) -> ShardSlice:
    return ShardSlice(1, part.start * unit, part.stop * unit, len(part) * unit)
