import pytest
import torch

from sluice.kernels import paged_decode_attention, paged_decode_attention_ref

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _run(make_paged_kv, device, seq_lens, num_heads, num_kv_heads, head_dim, dtype, num_splits, block_size=16,
         expire=None, sliding_window=0, softcap=0.0, sinks=False):
    """The kernel against the reference; with expire (the expire_before_windows fixture), over caches whose
    positions before each window are NaN."""
    key_cache, value_cache, block_tables, lens = make_paged_kv(seq_lens, num_kv_heads, head_dim, dtype, block_size)
    if expire is not None:
        expire(key_cache, value_cache, block_tables, seq_lens, [n - 1 for n in seq_lens], sliding_window)
    query = torch.randn(len(seq_lens), num_heads, head_dim, device=device).to(dtype)
    scale = head_dim ** -0.5
    variant = dict(sliding_window=sliding_window, softcap=softcap,
                   sinks=torch.randn(num_heads, device=device) + 3 if sinks else None)
    out = paged_decode_attention(query, key_cache, value_cache, block_tables, lens, scale, num_splits=num_splits,
                                 **variant)
    ref = paged_decode_attention_ref(query, key_cache, value_cache, block_tables, lens, scale, **variant)
    assert out.shape == query.shape and out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 3, 4])
def test_gqa_and_dtypes(make_paged_kv, device, dtype, head_dim, group):
    _run(make_paged_kv, device, [1, 5, 123], 2 * group, 2, head_dim, dtype, num_splits=3)


@pytest.mark.parametrize("num_splits", [1, 2, 7, None])
def test_splits(make_paged_kv, device, num_splits):
    # 7 splits of 123 tokens: split length rounds up to whole tiles, so the last splits are short or empty
    _run(make_paged_kv, device, [123, 1, 33, 16, 17], 4, 2, 64, torch.float32, num_splits)


@pytest.mark.parametrize("num_splits", [1, 4, None])
@pytest.mark.parametrize("window", [1, 11, 20, 1000])
def test_sliding_window(make_paged_kv, expire_before_windows, device, num_splits, window):
    # the longest context's window starts mid-block (1, 20) or on a block edge (11: position 112); 1000 is longer than
    # every context. The splits cut the window's tiles only, some of them empty. Earlier positions are NaN.
    _run(make_paged_kv, device, [123, 50, 17, 16, 1], 6, 2, 64, torch.float32, num_splits,
         expire=expire_before_windows, sliding_window=window)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("sliding_window, softcap, sinks", [
    (0, 1.5, False), (0, 0.0, True), (20, 1.5, False), (20, 0.0, True), (5, 1.5, True)])
def test_softcap_sinks_and_combinations(make_paged_kv, expire_before_windows, device, num_splits, sliding_window,
                                        softcap, sinks):
    # the context-less row yields zeros with sinks too; over 3 splits the sinks count once
    _run(make_paged_kv, device, [123, 40, 1, 0], 6, 2, 64, torch.bfloat16, num_splits, expire=expire_before_windows,
         sliding_window=sliding_window, softcap=softcap, sinks=sinks)


@pytest.mark.parametrize("block_size", [8, 32])
def test_block_sizes(make_paged_kv, device, block_size):
    _run(make_paged_kv, device, [5, 70], 3, 1, 64, torch.bfloat16, num_splits=2, block_size=block_size)


def test_head_dim_not_power_of_two(make_paged_kv, device):
    _run(make_paged_kv, device, [50, 3], 4, 2, 96, torch.float32, num_splits=2)


def test_strided_query_and_empty_context(make_paged_kv, device):
    key_cache, value_cache, block_tables, lens = make_paged_kv([40, 0], 1, 64, torch.float32)
    qkv = torch.randn(2, 4, 64, device=device)  # query is a strided view, like a slice of a fused qkv output
    query = qkv[:, :2]
    out = paged_decode_attention(query, key_cache, value_cache, block_tables, lens, 0.125, num_splits=2)
    ref = paged_decode_attention_ref(query, key_cache, value_cache, block_tables, lens, 0.125)
    torch.testing.assert_close(out, ref)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # a padded batch row with no context yields zeros


def test_rejects_bad_inputs(make_paged_kv, device):
    key_cache, value_cache, block_tables, lens = make_paged_kv([5], 2, 64, torch.float32)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(torch.randn(1, 3, 64, device=device), key_cache, value_cache, block_tables, lens, 1.0)
    with pytest.raises(TypeError):
        paged_decode_attention(torch.randn(1, 2, 64, device=device).half(), key_cache, value_cache, block_tables,
                               lens, 1.0)
    with pytest.raises(ValueError, match="block_tables"):
        paged_decode_attention(torch.randn(1, 2, 64, device=device), key_cache, value_cache, block_tables.long(),
                               lens, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("head_dim, group", [(64, 2), (96, 3)])
def test_fp8_cache(make_fp8_paged_kv, device, dtype, num_splits, head_dim, group):
    key_cache, value_cache, block_tables, lens, k_scale, v_scale = make_fp8_paged_kv([1, 40, 123], 2, head_dim)
    query = torch.randn(3, 2 * group, head_dim, device=device).to(dtype)
    out = paged_decode_attention(query, key_cache, value_cache, block_tables, lens, 0.125, num_splits=num_splits,
                                 k_scale=k_scale, v_scale=v_scale)
    ref = paged_decode_attention_ref(query, key_cache, value_cache, block_tables, lens, 0.125, k_scale, v_scale)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, **TOL[dtype])


def test_fp8_cache_head_dim_in_whole_words(make_fp8_paged_kv, device):
    key_cache, value_cache, block_tables, lens, k_scale, v_scale = make_fp8_paged_kv([5], 1, 66)
    with pytest.raises(ValueError, match="multiple of 4"):
        paged_decode_attention(torch.randn(1, 2, 66, device=device), key_cache, value_cache, block_tables, lens, 1.0,
                               k_scale=k_scale, v_scale=v_scale)


def test_fp8_cache_needs_both_scales(make_fp8_paged_kv, device):
    key_cache, value_cache, block_tables, lens, k_scale, _ = make_fp8_paged_kv([5], 1, 64)
    query = torch.randn(1, 2, 64, device=device)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        paged_decode_attention(query, key_cache, value_cache, block_tables, lens, 1.0, k_scale=k_scale)
    with pytest.raises(ValueError, match="k_scale and v_scale"):
        paged_decode_attention(query, key_cache.float(), value_cache.float(), block_tables, lens, 1.0,
                               k_scale=k_scale, v_scale=k_scale)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_fp8_cache_with_every_variant(make_fp8_paged_kv, expire_before_windows, device, num_splits):
    seq_lens = [1, 40, 123]
    key_cache, value_cache, block_tables, lens, k_scale, v_scale = make_fp8_paged_kv(seq_lens, 2, 64)
    expire_before_windows(key_cache, value_cache, block_tables, seq_lens, [0, 39, 122], 20)
    query = torch.randn(3, 4, 64, device=device)
    variant = dict(sliding_window=20, softcap=1.5, sinks=torch.randn(4, device=device) + 3)
    out = paged_decode_attention(query, key_cache, value_cache, block_tables, lens, 0.125, num_splits=num_splits,
                                 k_scale=k_scale, v_scale=v_scale, **variant)
    ref = paged_decode_attention_ref(query, key_cache, value_cache, block_tables, lens, 0.125, k_scale, v_scale,
                                     **variant)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])


@pytest.mark.gpu
@pytest.mark.parametrize("variant", [{}, dict(sliding_window=1000, softcap=50.0, sinks=True),
                                     dict(sliding_window=128, sinks=True)])
@pytest.mark.parametrize("batch, max_context", [(1, 4096), (64, 4096), (256, 1024)])
def test_realistic(make_paged_kv, expire_before_windows, device, batch, max_context, variant):
    seq_lens = torch.randint(1, max_context + 1, (batch,)).tolist()
    seq_lens[0] = max_context
    _run(make_paged_kv, device, seq_lens, 16, 8, 128, torch.bfloat16, num_splits=None,
         expire=expire_before_windows if variant else None, **variant)


@pytest.mark.parametrize("num_splits", [1, 3, 7])
@pytest.mark.parametrize("group, max_group_rows", [(1, 4), (2, 4), (4, 2)])
@pytest.mark.parametrize("fp8", [False, True])
def test_rows_of_one_sequence_attended_together(make_paged_kv, make_fp8_paged_kv, device, num_splits, group,
                                                max_group_rows, fp8):
    """A verification's rows: each request's newest token and proposals, one row each, contexts one position apart
    through the same block table row; the rows of a request go to programs of at most max_group_rows."""
    _run_verification(make_paged_kv, make_fp8_paged_kv, device, num_splits, group, max_group_rows, fp8)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("window", [5, 32])
@pytest.mark.parametrize("fp8", [False, True])
def test_rows_of_one_sequence_with_every_variant(make_paged_kv, make_fp8_paged_kv, expire_before_windows, device,
                                                 num_splits, window, fp8):
    # each row sees its own window, and only the first row of 47 sees position 15 (window 32), at the end of a tile
    # that the later rows see in part; every sequence's positions before its first row's window are NaN
    _run_verification(make_paged_kv, make_fp8_paged_kv, device, num_splits, 2, 4, fp8, expire_before_windows,
                      sliding_window=window, softcap=1.5, sinks=True)


def _run_verification(make_paged_kv, make_fp8_paged_kv, device, num_splits, group, max_group_rows, fp8, expire=None,
                      sliding_window=0, softcap=0.0, sinks=False):
    first_lens, num_rows = [16, 15, 47, 1, 33], [4, 1, 3, 2, 4]
    seq_lens = [n + r for n, r in zip(first_lens, num_rows)]
    k_scale = v_scale = None
    if fp8:
        key_cache, value_cache, tables, _, k_scale, v_scale = make_fp8_paged_kv(seq_lens, 2, 64)
    else:
        key_cache, value_cache, tables, _ = make_paged_kv(seq_lens, 2, 64, torch.float32)
    if expire is not None:
        expire(key_cache, value_cache, tables, seq_lens, [n - 1 for n in first_lens], sliding_window)
    row_tables = tables.repeat_interleave(torch.tensor(num_rows, device=device), dim=0)
    lens = torch.tensor([n + j for n, r in zip(first_lens, num_rows) for j in range(r)], dtype=torch.int32,
                        device=device)
    groups = [min(max_group_rows, r - j) if j % max_group_rows == 0 else 0 for r in num_rows for j in range(r)]
    query = torch.randn(len(groups), 2 * group, 64, device=device)
    scale = 64 ** -0.5
    variant = dict(sliding_window=sliding_window, softcap=softcap,
                   sinks=torch.randn(2 * group, device=device) + 3 if sinks else None)
    out = paged_decode_attention(query, key_cache, value_cache, row_tables, lens, scale, num_splits=num_splits,
                                 k_scale=k_scale, v_scale=v_scale,
                                 row_groups=torch.tensor(groups, dtype=torch.int32, device=device),
                                 max_group_rows=max_group_rows, **variant)
    ref = paged_decode_attention_ref(query, key_cache, value_cache, row_tables, lens, scale, k_scale, v_scale,
                                     **variant)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
