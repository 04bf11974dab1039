import pytest
import torch

from sluice.kernels.w4a16 import DECODE_ROWS, w4a16_launch_config, w4a16_linear, w4a16_linear_ref
from sluice.kernels.w4a16_layout import (SYMMETRIC_ZERO, W4A16Weight, awq_dequantize_ref,
                                         compressed_tensors_dequantize_ref, dequantize, from_awq,
                                         from_compressed_tensors, from_gptq, gptq_dequantize_ref, input_run, pack_int4,
                                         unpack_int4)
from tests.kernels.w4a16_packing import to_awq, to_compressed_tensors, to_gptq, wrapped

# bf16: the dequantized weight rounds once (as the reference's), the sums differ in order and, under the CPU
# interpreter, in rounding
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=5e-2, rtol=2e-2)}


def _known(k: int, n: int, group: int, device, zeros: bool = True, act_order: bool = False):
    """Known int4 values q [K, N], zero points [G, N] (None: symmetric), scales [G, N] and the group of each input
    (GPTQ's act-order: inputs ranked by a random order, each run of `group` of them a group; else None)."""
    q = torch.randint(0, 16, (k, n), device=device)
    z = torch.randint(0, 16, (k // group, n), device=device) if zeros else None
    scales = torch.rand(k // group, n, device=device) * 0.01 + 0.01
    g_idx = (torch.argsort(torch.randperm(k, device=device)) // group).to(torch.int32) if act_order else None
    return q, z, scales, g_idx


def _expected(q, z, scales, g_idx, dtype) -> torch.Tensor:
    """The weight [N, K] the known values stand for."""
    groups = g_idx.long() if g_idx is not None else torch.arange(q.shape[0], device=q.device) // (
        q.shape[0] // scales.shape[0])
    zeros = SYMMETRIC_ZERO if z is None else z[groups]
    return ((q - zeros).to(dtype) * scales.to(dtype)[groups]).T


def test_pack_round_trip(device):
    values = torch.randint(0, 16, (24, 40), device=device)
    for dim in (0, 1):
        words = pack_int4(values, dim)
        assert words.dtype == torch.int32 and words.shape[dim] == values.shape[dim] // 8
        assert torch.equal(unpack_int4(words, dim), values)
    assert pack_int4(torch.tensor([[1, 2, 0, 0, 0, 0, 0, 15]]), 1).item() == wrapped(torch.tensor(0xF0000021))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("v1", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_round_trip(device, group, sym, v1, act_order):
    q, z, scales, g_idx = _known(256, 48, group, device, zeros=not sym, act_order=act_order)
    if not sym:
        z[0, :8] = torch.tensor([0, 15, 0, 0, 1, 0, 15, 0])  # v1's borrows across a word
    qweight, qzeros = to_gptq(q, z, scales.half(), v1)
    expected = _expected(q, z, scales.half(), g_idx, torch.half)
    assert torch.equal(gptq_dequantize_ref(qweight, scales.half(), qzeros, g_idx, sym=sym, v1=v1), expected)
    weight = from_gptq(qweight, scales.half(), qzeros, g_idx, sym=sym, v1=v1)
    assert (weight.perm is not None) == act_order and (weight.zeros is None) == sym
    assert torch.equal(dequantize(weight), expected)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_awq_round_trip(device, group):
    q, z, scales, _ = _known(256, 48, group, device)
    qweight, qzeros = to_awq(q), to_awq(z)
    expected = _expected(q, z, scales.half(), None, torch.half)
    assert torch.equal(awq_dequantize_ref(qweight, qzeros, scales.half()), expected)
    weight = from_awq(qweight, qzeros, scales.half(), dtype=torch.bfloat16)
    assert weight.scales.dtype == torch.bfloat16
    assert torch.equal(dequantize(from_awq(qweight, qzeros, scales.half())), expected)


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("zeros", [True, False])
@pytest.mark.parametrize("act_order", [False, True])
def test_compressed_tensors_round_trip(device, group, zeros, act_order):
    q, z, scales, g_idx = _known(256, 36, group, device, zeros=zeros, act_order=act_order)  # 36: zero points padded
    packed, zero_point = to_compressed_tensors(q, z)
    scale = scales.T.contiguous().to(torch.bfloat16)
    expected = _expected(q, z, scales.to(torch.bfloat16), g_idx, torch.bfloat16)
    assert torch.equal(compressed_tensors_dequantize_ref(packed, scale, zero_point, g_idx), expected)
    assert torch.equal(dequantize(from_compressed_tensors(packed, scale, zero_point, g_idx)), expected)


def test_rejects_uneven_act_order_groups(device):
    q, _, scales, _ = _known(64, 16, 32, device)
    with pytest.raises(ValueError, match="g_idx"):
        from_gptq(pack_int4(q, 0), scales, g_idx=torch.zeros(64, dtype=torch.int32, device=device))


def _weight(k, n, group, dtype, device, zeros, act_order) -> W4A16Weight:
    q, z, scales, _ = _known(k, n, group, device, zeros=zeros)
    perm = torch.randperm(k, device=device).to(torch.int32) if act_order else None
    return W4A16Weight(pack_int4(q, 0), scales.to(dtype), None if z is None else z.to(torch.uint8), perm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 5, 37])  # decode kernel, decode kernel of a few rows, GEMM
@pytest.mark.parametrize("zeros", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_matches_dequantized_reference(device, dtype, group, m, zeros, act_order):
    weight = _weight(384, 201, group, dtype, device, zeros, act_order)
    x = torch.randn(m, 384, device=device).to(dtype)
    bias = torch.randn(201, device=device).to(dtype) if zeros else None
    out = w4a16_linear(x, weight, bias)
    assert out.shape == (m, 201) and out.dtype == dtype
    torch.testing.assert_close(out, w4a16_linear_ref(x, weight, bias), **TOL[dtype])


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m", [1, 5, 37])  # decode kernel, decode kernel of a few rows, GEMM
@pytest.mark.parametrize("zeros", [False, True])
def test_a_ranks_share_of_act_order_inputs_names_each_rows_group(device, group, m, zeros):
    """Rank 1 of 2's inputs (192-383) of an act-order weight: in their own order, each row looking its group up among
    all the weight's groups; the kernels take the rows that a word's eight inputs scatter over groups."""
    whole = _weight(384, 201, group, torch.float32, device, zeros, act_order=True)
    share = input_run(whole, 192, 384)
    assert share.perm is None and share.group_index.unique().numel() == 384 // group  # every group among its rows
    assert torch.equal(dequantize(share), dequantize(whole)[:, 192:])
    x = torch.randn(m, 192, device=device)
    bias = torch.randn(201, device=device) if zeros else None
    torch.testing.assert_close(w4a16_linear(x, share, bias), w4a16_linear_ref(x, share, bias), **TOL[torch.float32])


@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_both_kernels_take_few_rows(device, decode, m):
    """Odd N and a row count below the GEMM's row tile (masked rows), and the decode kernel's rows past M."""
    weight = _weight(128, 37, 32, torch.float32, device, True, True)
    x = torch.randn(m, 128, device=device)
    config = w4a16_launch_config(m if decode else DECODE_ROWS + 1, 37, 128, 32, torch.float32, device)
    assert config["decode"] == decode
    torch.testing.assert_close(w4a16_linear(x, weight, launch_config=config), w4a16_linear_ref(x, weight),
                               **TOL[torch.float32])


def test_per_channel_weights(device):
    """One group over all of K (GPTQ's group_size -1), K not a power of two."""
    weight = _weight(96, 24, 96, torch.float32, device, True, False)
    x = torch.randn(2, 96, device=device)
    torch.testing.assert_close(w4a16_linear(x, weight), w4a16_linear_ref(x, weight), **TOL[torch.float32])


def test_rejects_mismatched_inputs(device):
    weight = _weight(64, 16, 32, torch.float32, device, False, False)
    with pytest.raises(ValueError, match="does not fit"):
        w4a16_linear(torch.randn(1, 64, device=device).to(torch.bfloat16), weight)
    with pytest.raises(ValueError, match="multiple of 16"):
        W4A16Weight(weight.qweight, torch.ones(8, 16, device=device), None, None)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 8, 16, 100, 1000])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])  # Llama-3.1-8B
def test_realistic(device, m, n, k):
    weight = _weight(k, n, 128, torch.bfloat16, device, True, False)
    x = torch.randn(m, k, device=device).to(torch.bfloat16)
    torch.testing.assert_close(w4a16_linear(x, weight), w4a16_linear_ref(x, weight), atol=1e-1, rtol=2e-2)
