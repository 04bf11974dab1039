import pytest
import torch

from sluice.kernels import prepare_qkv, prepare_qkv_ref, reshape_and_cache, rms_norm, rotary_embedding
from sluice.kernels.kv_quant import KV_FP8, from_cache_element_ref
from sluice.worker.models.rope import build_cos_sin_cache

# NOTE: bf16 is looser than in the single-kernel tests: the refs round every rotary product to bf16 and the
# interpreter truncates where the GPU rounds, so after norm and rotary |kernel - ref| reached 0.032 * (1 + |ref|)
# (123 tokens, 3 seeds per shape). test_equals_unfused_kernels checks equality with the kernels it replaces.
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}
MAX_POSITION = 4096


def make_inputs(device, dtype, num_tokens, num_heads, num_kv_heads, head_dim, norm, block_size=16,
                rotary_dim=None) -> dict:
    """prepare_qkv's arguments: qkv a view of a wider projection output (padded token and head strides), random
    caches, and every fourth slot from the second on a padding -1; a cos/sin table of rotary_dim (None: head_dim);
    q/k norms `norm`: None, "llama" (weights near 1) or "gemma" (weights near 0: Gemma's norm multiplies by 1 + w)."""
    wide = torch.randn(num_tokens, num_heads + 2 * num_kv_heads + 1, head_dim + 8, device=device).to(dtype)
    num_blocks = num_tokens // block_size + 3
    key_cache, value_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, device=device).to(dtype)
    slot_mapping = torch.randperm(num_blocks * block_size, device=device)[:num_tokens]
    slot_mapping[1::4] = -1
    norm_weights = (None, None)
    if norm:
        norm_weights = ((norm == "llama") + 0.1 * torch.randn(2, head_dim, device=device)).to(dtype)
    return dict(
        qkv=wide[:, 1:, :head_dim],
        positions=torch.randint(0, MAX_POSITION, (num_tokens,), device=device),
        cos_sin_cache=build_cos_sin_cache(rotary_dim or head_dim, MAX_POSITION, 10000.0, None,
                                          torch.float32).to(device),
        q_norm_weight=norm_weights[0], k_norm_weight=norm_weights[1], eps=1e-6, gemma_norm=norm == "gemma",
        key_cache=key_cache, value_cache=value_cache, slot_mapping=slot_mapping,
    )


def with_cache_copies(inputs: dict) -> dict:
    return {**inputs, "key_cache": inputs["key_cache"].clone(), "value_cache": inputs["value_cache"].clone()}


def unfused_kernels(qkv, positions, cos_sin_cache, q_norm_weight, k_norm_weight, eps, key_cache, value_cache,
                    slot_mapping, gemma_norm):
    """The launches prepare_qkv replaces: rms_norm of q and of k, rotary_embedding, reshape_and_cache."""
    num_kv_heads = key_cache.shape[2]
    q, k, v = qkv.split([qkv.shape[1] - 2 * num_kv_heads, num_kv_heads, num_kv_heads], dim=1)
    if q_norm_weight is None:
        q, k = q.clone(), k.clone()
    else:
        q, k = rms_norm(q, q_norm_weight, eps, gemma_norm), rms_norm(k, k_norm_weight, eps, gemma_norm)
    rotary_embedding(positions, q, k, cos_sin_cache)
    reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
    return q


HEAD_SHAPES = [  # num_heads, num_kv_heads, head_dim, norm, rotary_dim
    (4, 4, 64, None, None), (6, 2, 128, "llama", None), (3, 1, 80, "llama", None),
    (6, 2, 128, None, 96), (3, 1, 80, "llama", 20),  # partial rotary: Phi-4-mini's 0.75 of 128, and a quarter of 80
    (8, 4, 256, "gemma", None), (3, 1, 80, "gemma", None),  # Gemma 3 (4B's heads)
]


# Each token is a program of its own, whose path depends on the head shape and on its slot alone: 5 tokens hold a
# padding slot (the second) and real ones, so every head shape runs at 1 and 5 tokens, and one shape at 123 (many
# programs). NOTE: in the interpreter 123 tokens took 1.4-4.8 s a case; at every shape, 35 of this test's 38 s.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens, num_heads, num_kv_heads, head_dim, norm, rotary_dim", [
    *((num_tokens, *shape) for shape in HEAD_SHAPES for num_tokens in (1, 5)), (123, *HEAD_SHAPES[1])])
def test_matches_ref(device, dtype, num_tokens, num_heads, num_kv_heads, head_dim, norm, rotary_dim):
    inputs = make_inputs(device, dtype, num_tokens, num_heads, num_kv_heads, head_dim, norm, rotary_dim=rotary_dim)
    ref_inputs = with_cache_copies(inputs)
    qkv_before = inputs["qkv"].clone()

    q = prepare_qkv(**inputs)
    ref_q = prepare_qkv_ref(**ref_inputs)
    assert q.shape == (num_tokens, num_heads, head_dim) and q.is_contiguous() and q.dtype == dtype
    torch.testing.assert_close(q, ref_q, **TOL[dtype])
    torch.testing.assert_close(inputs["key_cache"], ref_inputs["key_cache"], **TOL[dtype])
    assert torch.equal(inputs["value_cache"], ref_inputs["value_cache"])  # v copied bit for bit, -1 slots skipped
    assert torch.equal(inputs["qkv"], qkv_before)


@pytest.mark.parametrize("rotary_dim", [None, 96], ids=["whole_heads", "partial_rotary"])
@pytest.mark.parametrize("norm", ["llama", "gemma", None], ids=["qk_norm", "gemma_qk_norm", "no_norm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_unfused_kernels(device, norm, dtype, rotary_dim):
    inputs = make_inputs(device, dtype, 5, 6, 2, 128, norm, rotary_dim=rotary_dim)
    unfused_inputs = with_cache_copies(inputs)
    assert_same(prepare_qkv(**inputs), unfused_kernels(**unfused_inputs), dtype)
    assert_same(inputs["key_cache"], unfused_inputs["key_cache"], dtype)
    assert torch.equal(inputs["value_cache"], unfused_inputs["value_cache"])


def assert_same(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Bit for bit in the interpreter. Compiled, the norm's sum reduces in another order than rms_norm's, so the
    last bit of a rounded element may differ (seen on the H200 in float32)."""
    if actual.is_cuda:
        torch.testing.assert_close(actual, expected, **TOL[dtype])
    else:
        assert torch.equal(actual, expected)


@pytest.mark.parametrize("change, error", [
    (lambda args: dict(k_norm_weight=None), "together"),
    (lambda args: dict(slot_mapping=args["slot_mapping"].int()), "slot_mapping"),
    (lambda args: dict(qkv=args["qkv"][:, :4]), "kv heads"),
    (lambda args: dict(key_cache=args["key_cache"].bfloat16()), "dtype"),
    (lambda args: dict(cos_sin_cache=args["cos_sin_cache"].repeat(1, 2)), "rotary_dim <= head_dim"),
    (lambda args: dict(cos_sin_cache=args["cos_sin_cache"][:, :31]), "even rotary_dim"),
], ids=["one_norm_weight", "int32_slots", "too_few_heads", "cache_dtype", "table_wider_than_heads", "odd_table"])
def test_rejects_bad_inputs(device, change, error):
    inputs = make_inputs(device, torch.float32, 3, 4, 2, 64, norm="llama")
    with pytest.raises((ValueError, TypeError), match=error):
        prepare_qkv(**{**inputs, **change(inputs)})


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_cache_matches_ref(device, dtype):
    inputs = make_inputs(device, dtype, 123, 6, 2, 128, norm="llama")
    scales = torch.tensor([1 / 128, 1 / 64], device=device)  # randn / scale reaches e4m3's 448: the tails clamp
    inputs |= dict(key_cache=inputs["key_cache"].to(KV_FP8), value_cache=inputs["value_cache"].to(KV_FP8),
                   k_scale=scales[0], v_scale=scales[1])
    ref_inputs = with_cache_copies(inputs)
    torch.testing.assert_close(prepare_qkv(**inputs), prepare_qkv_ref(**ref_inputs), **TOL[dtype])
    # v is quantized as it came, bit for bit; k after norm and rotary, which kernel and reference compute within
    # TOL[dtype] of each other, as q above: that, plus one e4m3 step (1/8 relative, or 2^-9 * scale near zero) where
    # the difference crosses a rounding boundary
    assert torch.equal(inputs["value_cache"].view(torch.uint8), ref_inputs["value_cache"].view(torch.uint8))
    torch.testing.assert_close(from_cache_element_ref(inputs["key_cache"], scales[0]),
                               from_cache_element_ref(ref_inputs["key_cache"], scales[0]),
                               rtol=0.125 + TOL[dtype]["rtol"], atol=scales[0].item() * 2 ** -9 + TOL[dtype]["atol"])


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, norm", [(16, 8, 128, "llama"), (8, 4, 256, "gemma")])
def test_realistic(device, num_heads, num_kv_heads, head_dim, norm):
    inputs = make_inputs(device, torch.bfloat16, 8192, num_heads, num_kv_heads, head_dim, norm)
    ref_inputs, unfused_inputs = with_cache_copies(inputs), with_cache_copies(inputs)
    q = prepare_qkv(**inputs)
    torch.testing.assert_close(q, prepare_qkv_ref(**ref_inputs), **TOL[torch.bfloat16])
    torch.testing.assert_close(inputs["key_cache"], ref_inputs["key_cache"], **TOL[torch.bfloat16])
    assert_same(q, unfused_kernels(**unfused_inputs), torch.bfloat16)
    assert_same(inputs["key_cache"], unfused_inputs["key_cache"], torch.bfloat16)
    assert torch.equal(inputs["value_cache"], unfused_inputs["value_cache"])
