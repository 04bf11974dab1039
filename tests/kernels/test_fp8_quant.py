import pytest
import torch

from sluice.kernels.fp8_quant import (FP8, FP8_MAX, MIN_SCALE, quantize_row_groups_fp8, quantize_row_groups_fp8_ref,
                                      quantize_rows_fp8, quantize_rows_fp8_ref)

E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(FP8).float()
E4M3_VALUES = E4M3_VALUES[E4M3_VALUES.isfinite()]


def _representable_rows(rows: int, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rows of e4m3 values times a power of two, each row's largest magnitude FP8_MAX: the kernel and its reference
    meet no rounding (Triton's interpreter rounds FP8 stores wrongly, so inexact inputs are checked on CUDA)."""
    values = E4M3_VALUES[torch.randint(len(E4M3_VALUES), (rows, k))]
    values[torch.arange(rows), torch.randint(k, (rows,))] = FP8_MAX * torch.where(torch.rand(rows) < 0.5, -1.0, 1.0)
    powers = 2.0 ** torch.randint(-12, 4, (rows, 1)).float()
    return (values * powers).to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, k", [(1, 1), (5, 64), (3, 1000), (2, 4096 + 3)])
def test_matches_the_reference(device, dtype, rows, k):
    x = _representable_rows(rows, k, dtype, device)
    out, scale = quantize_rows_fp8(x)
    ref_out, ref_scale = quantize_rows_fp8_ref(x)
    assert out.dtype == FP8 and scale.dtype == torch.float32
    assert torch.equal(scale, ref_scale)
    assert torch.equal(out.float(), ref_out.float())
    torch.testing.assert_close(out.float() * scale[:, None], x.float(), rtol=0, atol=0)


def test_strided_rows_zero_rows_and_no_rows(device):
    x = _representable_rows(4, 256, torch.bfloat16, device)
    x[2] = 0
    out, scale = quantize_rows_fp8(x[::2])  # rows 0 and 2, a stride of two rows
    assert torch.equal(scale, torch.stack([quantize_rows_fp8_ref(x[:1])[1][0], torch.tensor(MIN_SCALE, device=device)]))
    assert torch.equal(out.float(), quantize_rows_fp8_ref(x[::2])[0].float())
    assert not out[1].float().any()
    empty_out, empty_scale = quantize_rows_fp8(x[:0])
    assert empty_out.shape == (0, 256) and empty_scale.shape == (0,)


def test_rows_out_pads_with_zero_rows(device):
    x = _representable_rows(3, 300, torch.bfloat16, device)
    out, scale = quantize_rows_fp8(x, rows_out=8)
    ref_out, ref_scale = quantize_rows_fp8_ref(x, rows_out=8)
    assert out.shape == (8, 300) and torch.equal(scale, ref_scale) and torch.equal(out.float(), ref_out.float())
    assert torch.equal(out[:3].float(), quantize_rows_fp8(x)[0].float())
    assert not out[3:].float().any() and (scale[3:] == MIN_SCALE).all()
    with pytest.raises(ValueError, match="rows_out"):
        quantize_rows_fp8(x, rows_out=2)


def test_an_absmax_bound_caps_the_scales(device):
    x = _representable_rows(4, 512, torch.bfloat16, device)
    bound = x[:2].float().abs().amax().item() / 4  # below rows 0 and 1's maxima, whichever is larger
    out, scale = quantize_rows_fp8(x, rows_out=6, absmax_bound=bound)
    ref_out, ref_scale = quantize_rows_fp8_ref(x, rows_out=6, absmax_bound=bound)
    assert torch.equal(scale, ref_scale) and torch.equal(out.float(), ref_out.float())
    capped = x.float().abs().amax(-1) > bound
    assert capped.any() and torch.equal(scale[:4][capped], torch.full_like(scale[:4][capped], bound / FP8_MAX))
    assert torch.equal(scale[:4][~capped], quantize_rows_fp8(x)[1][~capped])
    assert (out[:4][capped].float().abs().amax(-1) == FP8_MAX).all()


@pytest.mark.parametrize("k", [256, 200])  # 200: a last group of 72 columns, completed with zeros
def test_row_groups_are_quantized_as_rows(device, k):
    """Groups of 128 columns, each quantized as a row of its own (block-wise FP8 GEMMs' activations)."""
    x = torch.cat([_representable_rows(3, 128, torch.bfloat16, device),
                   _representable_rows(3, k - 128, torch.bfloat16, device)], dim=1)
    out, scale = quantize_row_groups_fp8(x, 128)
    ref_out, ref_scale = quantize_row_groups_fp8_ref(x, 128)
    assert out.shape == (3, 256) and scale.shape == (3, 2)
    assert torch.equal(scale, ref_scale) and torch.equal(out.float(), ref_out.float())
    for group in range(2):
        columns = slice(128 * group, min(128 * (group + 1), k))
        rows_out, rows_scale = quantize_rows_fp8_ref(x[:, columns])
        assert torch.equal(scale[:, group], rows_scale) and torch.equal(out[:, columns].float(), rows_out.float())
    assert not out[:, k:].float().any()


def test_refuses_rows_that_are_not_contiguous(device):
    with pytest.raises(ValueError, match="contiguous rows"):
        quantize_rows_fp8(torch.randn(8, 8, device=device).T)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k", [(1, 4096), (256, 14336), (8192, 4096)])
def test_random_rows_bit_for_bit(device, rows, k):
    x = torch.randn(rows, k, device=device).to(torch.bfloat16) * torch.rand(rows, 1, device=device).to(torch.bfloat16)
    out, scale = quantize_rows_fp8(x)
    ref_out, ref_scale = quantize_rows_fp8_ref(x)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(out.view(torch.uint8), ref_out.view(torch.uint8))
