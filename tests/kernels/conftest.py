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


@pytest.fixture
def expire_before_windows():
    """Factory: what the scheduler may do once a sliding window has passed a sequence's positions, worse: every
    position before the window of the sequence's first query (at first_q_pos[i]) turns NaN in the caches, and the
    table entries of its wholly expired blocks point at a NaN block instead. Kernels that read none of them stay
    finite. Needs a decoy block (make_paged_kv allocates three); window 0 (none) expires nothing."""

    def expire(key_cache, value_cache, block_tables, seq_lens: list[int], first_q_pos: list[int], window: int):
        if not window:
            return
        block_size = key_cache.shape[1]
        live = {b for i, n in enumerate(seq_lens) for b in block_tables[i, :-(-n // block_size)].tolist()}
        decoy = min(set(range(key_cache.shape[0])) - live)
        for cache in (key_cache, value_cache):
            cache[decoy] = float("nan")
        for i, pos in enumerate(first_q_pos):
            first_seen = max(pos - window + 1, 0)
            boundary = block_tables[i, first_seen // block_size]
            for cache in (key_cache, value_cache):
                cache[boundary, :first_seen % block_size] = float("nan")
            block_tables[i, :first_seen // block_size] = decoy

    return expire
