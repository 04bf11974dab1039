import pytest
import torch

from sluice.kernels import rotary_embedding, rotary_embedding_ref
from sluice.worker.loading.shapes import PHI4_MINI_LONG_FACTOR
from sluice.worker.models.rope import build_cos_sin_cache, rope_frequencies

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}
YARN_SCALINGS = {  # gpt-oss's, Qwen's (truncated correction range, default betas), and one with mscales (DeepSeek)
    "yarn-gpt-oss": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                     "original_max_position_embeddings": 4096},
    "yarn-qwen": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
                    "original_max_position_embeddings": 4096},
}
LINEAR_SCALING = {"rope_type": "linear", "factor": 8.0}  # Gemma 3's global layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_tokens", [1, 5, 123])
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, rotary_dim", [
    (4, 4, 64, 64), (6, 2, 128, 128), (3, 1, 64, 64), (6, 2, 128, 96), (3, 1, 80, 20)])  # and partial rotaries
def test_matches_ref(device, dtype, num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim):
    cache = build_cos_sin_cache(rotary_dim, 4096, 500000.0, LLAMA3_SCALING, dtype).to(device)
    positions = torch.randint(0, 4096, (num_tokens,), device=device)
    # query and key are strided views of one fused qkv output, rotated in place
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, device=device).to(dtype)
    query, key = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads]
    ref_q, ref_k = query.clone(), key.clone()
    value_before = qkv[:, num_heads + num_kv_heads:].clone()

    rotary_embedding(positions, query, key, cache)
    rotary_embedding_ref(positions, ref_q, ref_k, cache)
    torch.testing.assert_close(query, ref_q, **TOL[dtype])
    torch.testing.assert_close(key, ref_k, **TOL[dtype])
    assert torch.equal(qkv[:, num_heads + num_kv_heads:], value_before)


def test_int32_positions_and_position_zero(device):
    cache = build_cos_sin_cache(64, 16, 10000.0, None, torch.float32).to(device)
    query, key = torch.randn(2, 3, 2, 64, device=device)
    q0, k0 = query.clone(), key.clone()
    rotary_embedding(torch.zeros(3, dtype=torch.int32, device=device), query, key, cache)
    torch.testing.assert_close(query, q0)  # position 0 is the identity
    torch.testing.assert_close(key, k0)


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3_SCALING, LINEAR_SCALING, *YARN_SCALINGS.values()],
                         ids=["default", "llama3", "linear", *YARN_SCALINGS])
@pytest.mark.parametrize("head_dim, base", [(64, 10000.0), (128, 500000.0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_transformers(rope_scaling, head_dim, base, dtype):
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rope_parameters = {"rope_type": "default", "rope_theta": base, **(rope_scaling or {})}
    config = llama.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                               max_position_embeddings=131072, rope_parameters=rope_parameters)
    if rope_scaling is None:
        hf_inv_freq, _ = llama.LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        hf_inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](config)
    assert torch.equal(rope_frequencies(head_dim, base, rope_scaling, 131072)[0], hf_inv_freq)

    # the table holds exactly the cos/sin HF computes for the same positions (YaRN's attention factor included), and
    # the ref rotates op for op
    positions = torch.tensor([0, 1, 17, 4095, 100000])
    x = torch.randn(1, 4, len(positions), head_dim).to(dtype)  # HF layout [batch, heads, tokens, head_dim]
    cos, sin = llama.LlamaRotaryEmbedding(config)(x, positions[None])
    cache = build_cos_sin_cache(head_dim, 131072, base, rope_scaling, dtype)
    half = head_dim // 2
    assert torch.equal(cache[positions, :half], cos[0, :, :half])
    assert torch.equal(cache[positions, half:], sin[0, :, :half])
    hf_q, hf_k = llama.apply_rotary_pos_emb(x, x[:, :2], cos, sin)
    query, key = x[0].transpose(0, 1).clone(), x[0, :2].transpose(0, 1).clone()  # [tokens, heads, head_dim]
    rotary_embedding_ref(positions, query, key, cache)
    assert torch.equal(query, hf_q[0].transpose(0, 1)) and torch.equal(key, hf_k[0].transpose(0, 1))


PHI4_MINI_SCALING = {"rope_type": "longrope", "short_factor": [1.0] * 48, "long_factor": PHI4_MINI_LONG_FACTOR,
                     "original_max_position_embeddings": 4096, "factor": 131072 / 4096}


@pytest.mark.parametrize("max_position, positions", [(4096, [0, 1, 17, 4095]), (8192, [0, 17, 4096, 8191])],
                         ids=["short", "long"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_longrope_matches_transformers(max_position, positions, dtype):
    """Phi-4-mini's LongRoPE with its partial rotary: a table no longer than original_max_position_embeddings holds
    the cos/sin transformers computes with the short factors, a longer one those of the long factors (transformers
    switches when a sequence outgrows that length), both times the attention factor; the ref rotates op for op as
    Phi-3's apply_rotary_pos_emb, leaving the last quarter of each head as it is."""
    phi3 = pytest.importorskip("transformers.models.phi3.modeling_phi3")
    hf_config = phi3.Phi3Config(hidden_size=3072, num_attention_heads=24, partial_rotary_factor=0.75,
                                max_position_embeddings=131072, original_max_position_embeddings=4096,
                                rope_scaling={"type": "longrope", "short_factor": [1.0] * 48,
                                              "long_factor": PHI4_MINI_LONG_FACTOR})
    positions = torch.tensor(positions)
    x = torch.randn(1, 4, len(positions), 128).to(dtype)
    cos, sin = phi3.Phi3RotaryEmbedding(hf_config)(x, positions[None])  # the long factors past position 4095
    cache = build_cos_sin_cache(96, max_position, 10000.0, PHI4_MINI_SCALING, dtype)
    assert torch.equal(cache[positions, :48], cos[0, :, :48]) and torch.equal(cache[positions, 48:], sin[0, :, :48])
    hf_q, hf_k = phi3.apply_rotary_pos_emb(x, x[:, :2], cos, sin)
    query, key = x[0].transpose(0, 1).clone(), x[0, :2].transpose(0, 1).clone()  # [tokens, heads, head_dim]
    rotary_embedding_ref(positions, query, key, cache)
    assert torch.equal(query, hf_q[0].transpose(0, 1)) and torch.equal(key, hf_k[0].transpose(0, 1))


@pytest.mark.gpu
def test_realistic(device):
    cache = build_cos_sin_cache(128, 40960, 1000000.0, None, torch.bfloat16).to(device)
    positions = torch.randint(0, 40960, (8192,), device=device)
    query = torch.randn(8192, 16, 128, device=device).to(torch.bfloat16)
    key = torch.randn(8192, 8, 128, device=device).to(torch.bfloat16)
    ref_q, ref_k = query.clone(), key.clone()
    rotary_embedding(positions, query, key, cache)
    rotary_embedding_ref(positions, ref_q, ref_k, cache)
    torch.testing.assert_close(query, ref_q, **TOL[torch.bfloat16])
    torch.testing.assert_close(key, ref_k, **TOL[torch.bfloat16])
