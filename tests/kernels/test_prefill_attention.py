import pytest
import torch

from sluice.kernels import paged_prefill_attention, paged_prefill_attention_ref

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _run(make_paged_kv, device, q_lens, seq_lens, num_heads, num_kv_heads, head_dim, dtype, block_size=16):
    key_cache, value_cache, block_tables, lens = make_paged_kv(seq_lens, num_kv_heads, head_dim, dtype, block_size)
    query_start_loc = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_dim, device=device).to(dtype)
    scale = head_dim ** -0.5
    out = paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, lens, scale)
    ref = paged_prefill_attention_ref(query, key_cache, value_cache, block_tables, query_start_loc, lens, scale)
    assert out.shape == query.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_gqa_and_dtypes(make_paged_kv, device, dtype, head_dim, group):
    # a fresh prompt, a chunk after a cached prefix, and a decode token, in one batch
    _run(make_paged_kv, device, [37, 23, 1], [37, 50, 20], group, 1, head_dim, dtype)


@pytest.mark.parametrize("q_lens, seq_lens", [
    ([1], [1]),
    ([5], [5]),
    ([123], [123]),
    ([5, 1, 123, 17], [37, 1, 140, 17]),  # chunked prefill / prefix-cache hits mixed with fresh prompts
    ([16, 0, 33], [48, 7, 33]),  # a sequence with nothing scheduled
])
def test_chunks_and_prefixes(make_paged_kv, device, q_lens, seq_lens):
    _run(make_paged_kv, device, q_lens, seq_lens, 8, 2, 64, torch.float32)


def test_block_size_32(make_paged_kv, device):
    _run(make_paged_kv, device, [20, 9], [70, 9], 3, 1, 64, torch.bfloat16, block_size=32)


def test_head_dim_not_power_of_two(make_paged_kv, device):
    _run(make_paged_kv, device, [20, 9], [50, 9], 4, 2, 96, torch.float32)


def test_rejects_bad_query_start_loc(make_paged_kv, device):
    key_cache, value_cache, block_tables, lens = make_paged_kv([5], 1, 64, torch.float32)
    query = torch.randn(5, 1, 64, device=device)
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_prefill_attention(query, key_cache, value_cache, block_tables,
                                torch.tensor([0, 5], device=device), lens, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache(make_fp8_paged_kv, device, dtype):
    # a fresh prompt, a chunk after a cached prefix, and a decode token, over FP8 caches
    key_cache, value_cache, block_tables, lens, k_scale, v_scale = make_fp8_paged_kv([37, 50, 20], 2, 64)
    query_start_loc = torch.tensor([0, 37, 60, 61], dtype=torch.int32, device=device)
    query = torch.randn(61, 6, 64, device=device).to(dtype)
    out = paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, lens, 0.125,
                                  k_scale=k_scale, v_scale=v_scale)
    ref = paged_prefill_attention_ref(query, key_cache, value_cache, block_tables, query_start_loc, lens, 0.125,
                                      k_scale, v_scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.gpu
def test_realistic(make_paged_kv, device):
    q_lens = [2048, 512, 1, 1000, 77]
    seq_lens = [2048, 3000, 4096, 1000, 1200]
    _run(make_paged_kv, device, q_lens, seq_lens, 16, 8, 128, torch.bfloat16)
