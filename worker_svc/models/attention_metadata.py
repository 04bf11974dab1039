from dataclasses import dataclass

import torch


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

    @property
    def num_seqs(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1
