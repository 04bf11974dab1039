import pytest
import torch

from sluice.kernels import paged_prefill_attention, paged_prefill_attention_ref

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
# prefill chunks of a batch: a fresh prompt, a chunk after a cached prefix, a decode token
Q_LENS, SEQ_LENS = [37, 23, 1], [37, 70, 50]


def _run(make_paged_kv, device, q_lens, seq_lens, num_heads, num_kv_heads, head_dim, dtype, block_size=16,
         expire=None, sliding_window=0, softcap=0.0, sinks=False):
    """The kernel against the reference; with expire (the expire_before_windows fixture), over caches whose
    positions before each chunk's window are NaN."""
    key_cache, value_cache, block_tables, lens = make_paged_kv(seq_lens, num_kv_heads, head_dim, dtype, block_size)
    if expire is not None:
        expire(key_cache, value_cache, block_tables, seq_lens, [n - q for q, n in zip(q_lens, seq_lens)],
               sliding_window)
    query_start_loc = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    query = torch.randn(sum(q_lens), num_heads, head_dim, device=device).to(dtype)
    scale = head_dim ** -0.5
    variant = dict(sliding_window=sliding_window, softcap=softcap,
                   sinks=torch.randn(num_heads, device=device) + 3 if sinks else None)
    out = paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, lens, scale,
                                  **variant)
    ref = paged_prefill_attention_ref(query, key_cache, value_cache, block_tables, query_start_loc, lens, scale,
                                      **variant)
    assert out.shape == query.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_gqa_and_dtypes(make_paged_kv, device, dtype, head_dim, group):
    # a fresh prompt, a chunk after a cached prefix, and a decode token, in one batch
    _run(make_paged_kv, device, [37, 23, 1], [37, 50, 20], group, 1, head_dim, dtype)


@pytest.mark.parametrize("window", [1, 5, 16, 20, 48, 1000])
def test_sliding_window(make_paged_kv, expire_before_windows, device, window):
    # the chunk's first query sits at 47 and the decode token at 49: its window starts mid-block (1, 5, 20), on a
    # block edge (16: position 32) or at 0 (48); 1000 is longer than every context. Earlier positions are NaN.
    _run(make_paged_kv, device, Q_LENS, SEQ_LENS, 6, 2, 64, torch.float32, expire=expire_before_windows,
         sliding_window=window)


def test_sliding_window_over_blocks_of_8(make_paged_kv, expire_before_windows, device):
    # the chunk's window starts at 24, a block edge inside a KV tile of 16 whose first block has expired
    _run(make_paged_kv, device, Q_LENS, SEQ_LENS, 4, 2, 64, torch.float32, block_size=8,
         expire=expire_before_windows, sliding_window=24)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sliding_window, softcap, sinks", [
    (0, 1.5, False), (0, 0.0, True), (20, 1.5, False), (20, 0.0, True), (5, 1.5, True)])
def test_softcap_sinks_and_combinations(make_paged_kv, expire_before_windows, device, dtype, sliding_window, softcap,
                                        sinks):
    _run(make_paged_kv, device, Q_LENS, SEQ_LENS, 6, 2, 64, dtype, expire=expire_before_windows,
         sliding_window=sliding_window, softcap=softcap, sinks=sinks)


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


@pytest.mark.parametrize("variant, match", [
    (dict(sliding_window=-1), "sliding_window"), (dict(softcap=-1.0), "softcap"),
    (dict(sinks=torch.zeros(2)), "sinks"), (dict(sinks=torch.zeros(4, dtype=torch.bfloat16)), "sinks")])
def test_rejects_bad_variants(make_paged_kv, device, variant, match):
    key_cache, value_cache, block_tables, lens = make_paged_kv([5], 2, 64, torch.float32)
    query_start_loc = torch.tensor([0, 5], dtype=torch.int32, device=device)
    variant = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in variant.items()}
    with pytest.raises(ValueError, match=match):
        paged_prefill_attention(torch.randn(5, 4, 64, device=device), key_cache, value_cache, block_tables,
                                query_start_loc, lens, 1.0, **variant)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_with_every_variant(make_fp8_paged_kv, expire_before_windows, device, dtype):
    key_cache, value_cache, block_tables, lens, k_scale, v_scale = make_fp8_paged_kv(SEQ_LENS, 2, 64)
    expire_before_windows(key_cache, value_cache, block_tables, SEQ_LENS, [0, 47, 49], 20)
    query_start_loc = torch.tensor([0, 37, 60, 61], dtype=torch.int32, device=device)
    query = torch.randn(61, 6, 64, device=device).to(dtype)
    variant = dict(sliding_window=20, softcap=1.5, sinks=torch.randn(6, device=device) + 3)
    out = paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, lens, 0.125,
                                  k_scale=k_scale, v_scale=v_scale, **variant)
    ref = paged_prefill_attention_ref(query, key_cache, value_cache, block_tables, query_start_loc, lens, 0.125,
                                      k_scale, v_scale, **variant)
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [{}, dict(sliding_window=1000, softcap=50.0, sinks=True),
                                     dict(sliding_window=128, sinks=True)])
def test_realistic(make_paged_kv, expire_before_windows, device, variant):
    q_lens = [2048, 512, 1, 1000, 77]
    seq_lens = [2048, 3000, 4096, 1000, 1200]
    _run(make_paged_kv, device, q_lens, seq_lens, 16, 8, 128, torch.bfloat16,
         expire=expire_before_windows if variant else None, **variant)
