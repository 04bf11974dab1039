import pytest
import torch

from sluice.kernels import reshape_and_cache, reshape_and_cache_ref
from sluice.kernels.kv_quant import KV_FP8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 123])
@pytest.mark.parametrize("num_kv_heads, head_dim, block_size", [(1, 64, 16), (3, 128, 16), (2, 64, 32), (8, 128, 8)])
def test_matches_ref(device, dtype, num_tokens, num_kv_heads, head_dim, block_size):
    num_blocks = num_tokens // block_size + 4
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.randn(cache_shape, device=device).to(dtype)
    value_cache = torch.randn(cache_shape, device=device).to(dtype)
    # key/value are strided views of one fused [k | v] tensor, as the worker slices them from qkv
    kv = torch.randn(num_tokens, 2 * num_kv_heads, head_dim, device=device).to(dtype)
    key, value = kv[:, :num_kv_heads], kv[:, num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slots[::4] = -1  # padding tokens
    ref_k, ref_v = key_cache.clone(), value_cache.clone()

    reshape_and_cache(key, value, key_cache, value_cache, slots)
    reshape_and_cache_ref(key, value, ref_k, ref_v, slots)
    assert torch.equal(key_cache, ref_k) and torch.equal(value_cache, ref_v)


def _fp8_inputs(device, num_tokens: int, dtype: torch.dtype):
    """FP8 caches of 8 blocks, tokens spread to the values that clamp, and scales that put 1.0 at e4m3's 64."""
    key_cache, value_cache = torch.zeros(2, 8, 16, 2, 64, dtype=KV_FP8, device=device)
    key, value = (10 * torch.randn(2, num_tokens, 2, 64, device=device)).to(dtype)
    slots = torch.randperm(8 * 16, device=device)[:num_tokens]
    slots[::4] = -1
    k_scale, v_scale = torch.tensor([1 / 64, 1 / 32], device=device)
    return key, value, key_cache, value_cache, slots, k_scale, v_scale


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_matches_ref(device, dtype):
    key, value, key_cache, value_cache, slots, k_scale, v_scale = _fp8_inputs(device, 100, dtype)
    ref_k, ref_v = key_cache.clone(), value_cache.clone()
    reshape_and_cache(key, value, key_cache, value_cache, slots, k_scale, v_scale)
    reshape_and_cache_ref(key, value, ref_k, ref_v, slots, k_scale, v_scale)
    assert torch.equal(key_cache.view(torch.uint8), ref_k.view(torch.uint8))  # the same e4m3 rounding, bit for bit
    assert torch.equal(value_cache.view(torch.uint8), ref_v.view(torch.uint8))
    assert key_cache.float().abs().max() == 448  # the tails clamped to e4m3's largest value


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's FP8 stores")
def test_interpreter_refuses_fp8_writes(device):
    key, value, key_cache, value_cache, slots, k_scale, v_scale = _fp8_inputs(device, 5, torch.float32)
    with pytest.raises(ValueError, match="needs CUDA"):
        reshape_and_cache(key, value, key_cache, value_cache, slots, k_scale, v_scale)


def test_rejects_int32_slots(device):
    cache = torch.zeros(2, 16, 1, 64, device=device)
    with pytest.raises(ValueError, match="slot_mapping"):
        x = torch.zeros(3, 1, 64, device=device)
        reshape_and_cache(x, x, cache, cache.clone(), torch.arange(3, dtype=torch.int32, device=device))


@pytest.mark.gpu
def test_realistic(device):
    key_cache = torch.zeros(4096, 16, 8, 128, dtype=torch.bfloat16, device=device)
    value_cache = torch.zeros_like(key_cache)
    key, value = torch.randn(2, 8192, 8, 128, device=device).to(torch.bfloat16)
    slots = torch.randperm(4096 * 16, device=device)[:8192]
    reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache.view(-1, 8, 128)[slots], key)
    assert torch.equal(value_cache.view(-1, 8, 128)[slots], value)
