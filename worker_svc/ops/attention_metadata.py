"""Where a step's tokens sit in the paged KV cache, as every attention operator reads it."""
from dataclasses import dataclass

import torch

QUERY_TILE_ROWS = 16  # the decode attention kernel's least tile of query rows (tl.dot's)


def rows_per_program(num_heads: int, num_kv_heads: int) -> int:
    """How many rows of one sequence (a verification's) one decode attention program attends together: as many as
    their query heads of one KV head fill a tile of QUERY_TILE_ROWS."""
    return max(1, QUERY_TILE_ROWS // (num_heads // num_kv_heads))


@dataclass(slots=True)
class AttentionMetadata:
    """Where one step's tokens sit in the paged KV cache. Passed explicitly to every attention layer."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset of each new token
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32: context length of each sequence, new tokens included
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    token_seq_index: torch.Tensor  # [num_tokens] int64: the sequence each token belongs to
    token_query_pos: torch.Tensor  # [num_tokens] int64: the token's index inside its sequence's chunk
    max_query_len: int
    max_seq_len: int
    # int32 [num_seqs] for a decode step whose rows include consecutive tokens of one sequence: the rows (at most
    # max_group_rows) that one attention program takes from each first of them, 0 for the others; None: one each
    row_groups: torch.Tensor | None = None
    max_group_rows: int = 1

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1
