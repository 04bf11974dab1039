"""TritonOps.attention hands sliding_window, softcap and sinks to the kernel that runs the step: the decode kernel
for a step of single tokens, the prefill kernel for one with a chunk."""
import pytest
import torch

from sluice.kernels import paged_prefill_attention_ref
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.ops.triton_kernels import TritonOps

BLOCK_SIZE = 16


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _metadata(query_lens: list[int], seq_lens: list[int], block_tables: torch.Tensor) -> AttentionMetadata:
    device = block_tables.device
    query_start_loc = torch.tensor([0] + query_lens, device=device).cumsum(0).to(torch.int32)
    token_seq_index = torch.arange(len(query_lens), device=device).repeat_interleave(torch.tensor(query_lens,
                                                                                                  device=device))
    token_query_pos = torch.cat([torch.arange(n, device=device) for n in query_lens])
    first_positions = torch.tensor([n - q for q, n in zip(query_lens, seq_lens)], device=device)
    positions = first_positions[token_seq_index] + token_query_pos
    slot_mapping = block_tables[token_seq_index, positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE
    return AttentionMetadata(slot_mapping, query_start_loc, torch.tensor(seq_lens, dtype=torch.int32, device=device),
                             block_tables, token_seq_index, token_query_pos, max(query_lens), max(seq_lens))


@pytest.mark.parametrize("query_lens", [[1, 1], [5, 1]])
def test_attention_takes_every_variant(device, query_lens):
    torch.manual_seed(0)
    seq_lens = [40, 23]
    key_cache, value_cache = torch.randn(2, 6, BLOCK_SIZE, 2, 64, device=device).unbind(0)
    block_tables = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32, device=device)
    meta = _metadata(query_lens, seq_lens, block_tables)
    q = torch.randn(sum(query_lens), 4, 64, device=device)
    variant = dict(sliding_window=20, softcap=1.5, sinks=torch.randn(4, device=device) + 3)
    out = TritonOps().attention(q, key_cache, value_cache, meta, 0.125, **variant)
    ref = paged_prefill_attention_ref(q, key_cache, value_cache, block_tables, meta.query_start_loc, meta.seq_lens,
                                      0.125, **variant)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
