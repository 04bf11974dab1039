"""Kernel tests run compiled on CUDA when a GPU is present, else in Triton's interpreter on the CPU.

TRITON_INTERPRET must be set before any @triton.jit runs, so this file sets it before the test modules import
`kernels`. Tests marked `gpu` use realistic (large) shapes (tests/conftest.py skips them without CUDA).
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def make_paged_kv(device):
    """Factory: random K/V caches whose sequences own shuffled, non-contiguous blocks (plus unused decoy blocks),
    [num_blocks, block_size, num_kv_heads, head_dim] views of head-major storage, as the worker allocates them."""

    def make(seq_lens: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype, block_size: int = 16):
        blocks_per_seq = [-(-n // block_size) for n in seq_lens]
        max_blocks = max(max(blocks_per_seq), 1)
        num_blocks = sum(blocks_per_seq) + 3
        stored = (num_blocks, num_kv_heads, block_size, head_dim)
        key_cache = torch.randn(stored, device=device).to(dtype).transpose(1, 2)
        value_cache = torch.randn(stored, device=device).to(dtype).transpose(1, 2)
        perm = torch.randperm(num_blocks, device=device).to(torch.int32)
        block_tables = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32, device=device)
        used = 0
        for i, n in enumerate(blocks_per_seq):
            block_tables[i, :n] = perm[used:used + n]
            used += n
        seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        return key_cache, value_cache, block_tables, seq_lens_t

    return make


@pytest.fixture
def make_fp8_paged_kv(make_paged_kv, device):
    """Factory: make_paged_kv's float32 caches stored in FP8 with their scales (the largest values clamp)."""
    from sluice.kernels.kv_quant import KV_FP8, to_cache_element_ref

    def make(seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int = 16):
        key_cache, value_cache, block_tables, lens = make_paged_kv(seq_lens, num_kv_heads, head_dim, torch.float32,
                                                                   block_size)
        k_scale, v_scale = torch.tensor([3.5 / 448, 3 / 448], device=device)
        return (to_cache_element_ref(key_cache, KV_FP8, k_scale), to_cache_element_ref(value_cache, KV_FP8, v_scale),
                block_tables, lens, k_scale, v_scale)

    return make
