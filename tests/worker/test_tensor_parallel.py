"""Every sharded projection against the whole model, on real gloo groups (one process per rank) at world sizes 2
and 3, for every registered family, with uneven intermediate and vocabulary splits and KV heads both split and
replicated; then greedy generation, token-identical to the unsharded engine."""
import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import LoadedModel, ModelLoader
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.rope import build_cos_sin_cache
from sluice.worker.models.shard_layout import ShardLayout
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.kv_cache import allocate_kv_cache
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import run_greedy
from tests.worker.test_model_families import _TINY, FAMILIES

_ODD = {"hidden_size": 48, "intermediate_size": 75, "vocab_size": 101, "head_dim": 8}
HEADS = {2: [(6, 2), (6, 1)], 3: [(9, 3), (6, 1)]}  # (q heads, KV heads): KV heads split, then replicated
PROMPTS = [[5, 17, 99, 3], [42] * 9, list(range(60, 83))]


WORKER_CONFIG = WorkerConfig(model="tiny")


def _loaded(group, hf_config: dict, worker_config: WorkerConfig = WORKER_CONFIG) -> tuple[LoadedModel, LoadedModel]:
    """(the whole model, the rank's shard of it) from the same random weights."""
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=1)
    state = {name: t if name.endswith("norm.weight") else t * 10 for name, t in state.items()}  # lively outputs
    config = ModelConfig.from_hf(hf_config)
    layout = ShardLayout(config, group.rank, group.world_size)
    whole = ModelLoader(worker_config).build(config, to_worker_layout(dict(state), config))
    shard = {name: layout.shard(name, tensor) for name, tensor in state.items()}
    return whole, ModelLoader(worker_config, group).build(config, to_worker_layout(shard, config))


def _engines(group, hf_config: dict) -> tuple[WorkerEngine, WorkerEngine]:
    whole, sharded = _loaded(group, hf_config)
    return WorkerEngine(WORKER_CONFIG, whole), WorkerEngine(WORKER_CONFIG, sharded, group)


def _one_sequence(num_tokens: int, block_size: int = 16) -> AttentionMetadata:
    num_blocks = -(-num_tokens // block_size)
    return AttentionMetadata(
        slot_mapping=torch.arange(num_tokens), query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        block_tables=torch.arange(num_blocks, dtype=torch.int32)[None],
        token_seq_index=torch.zeros(num_tokens, dtype=torch.int64), token_query_pos=torch.arange(num_tokens),
        max_query_len=num_tokens, max_seq_len=num_tokens)


def _compare_layers(whole: WorkerEngine, sharded: WorkerEngine, is_driver: bool) -> None:
    torch.manual_seed(0)
    vocab, hidden = whole.model_config.vocab_size, whole.model_config.hidden_size
    ids = torch.tensor([0, 1, vocab // 2, vocab - 1, 50, 51, 33])  # both sides of every rank's vocabulary range
    n = len(ids)
    torch.testing.assert_close(sharded.model.embed_tokens(ids), whole.model.embed_tokens(ids))

    x = torch.randn(n, hidden)
    meta, positions = _one_sequence(n), torch.arange(n)
    cos_sin = build_cos_sin_cache(whole.model_config.rotary_dim, 64, whole.model_config.rope_theta,
                                  whole.model_config.rope_scaling, torch.float32)
    outputs = []
    for engine in (whole, sharded):
        layer = engine.model.layers[0]
        kv_cache = allocate_kv_cache(engine.local_config, 1, 16, torch.float32, torch.device("cpu"))[0]
        qkv, _ = layer.input_layernorm.project(x, None, layer.self_attn.qkv_proj)  # column-parallel q, k, v
        attention = layer.self_attn(qkv, positions, cos_sin, kv_cache, meta)  # row-parallel o
        gated, _ = layer.post_attention_layernorm.project(x, None, layer.mlp.gate_up_proj, gated=True)
        logits = engine.model(ids, positions, cos_sin, [kv_cache] * len(engine.model.layers), meta, None)
        outputs.append((attention, layer.mlp.down(gated), logits))
    (attention, mlp, logits), (tp_attention, tp_mlp, tp_logits) = outputs
    torch.testing.assert_close(tp_attention, attention, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(tp_mlp, mlp, rtol=1e-4, atol=1e-4)
    if is_driver:  # the vocabulary-parallel LM head, gathered
        torch.testing.assert_close(tp_logits, logits, rtol=1e-4, atol=1e-3)


def _check_rank(group) -> None:
    for heads, kv_heads in HEADS[group.world_size]:
        for family in sorted(FAMILIES):
            hf_config = {**_TINY, **_ODD, **FAMILIES[family], "num_attention_heads": heads,
                         "num_key_value_heads": kv_heads}
            whole, sharded = _engines(group, hf_config)
            _compare_layers(whole, sharded, group.is_driver)
            expected = run_greedy(whole, PROMPTS, 8, chunk=5)
            got = run_greedy(sharded, PROMPTS, 8, chunk=5)
            assert got == (expected if group.is_driver else [[]] * len(PROMPTS)), (family, heads, kv_heads)
            assert sharded.runner.kv_caches[0][0].shape[2] == max(kv_heads // group.world_size, 1)


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_model_matches_the_whole_one(world_size):
    run_on_ranks(_check_rank, world_size)


def _check_fp8_rank(group) -> None:
    """Each rank quantizes its own shards: a column-parallel row keeps the whole row's scale (the same projection
    rows as the whole model's), a row-parallel shard gets scales of its own columns (a close sum)."""
    hf_config = {**_TINY, **_ODD, **FAMILIES["qwen2"], "num_attention_heads": 6, "num_key_value_heads": 2}
    whole, sharded = _loaded(group, hf_config, WorkerConfig(model="tiny", quantization="fp8"))
    layout = ShardLayout(whole.config, group.rank, group.world_size)
    whole_qkv, shard_qkv = (loaded.model.layers[0].self_attn.qkv_proj for loaded in (whole, sharded))
    q_rows = slice(layout.q_heads.start * 8, layout.q_heads.stop * 8)
    assert shard_qkv.weight.dtype == whole_qkv.weight.dtype == torch.float8_e4m3fn
    assert torch.equal(shard_qkv.weight_scale[:q_rows.stop - q_rows.start], whole_qkv.weight_scale[q_rows])
    torch.manual_seed(0)
    x = torch.randn(5, hf_config["hidden_size"])
    torch.testing.assert_close(sharded.ops.linear(x, shard_qkv)[:, :q_rows.stop - q_rows.start],
                               whole.ops.linear(x, whole_qkv)[:, q_rows])
    gated = torch.randn(5, len(layout.intermediate))
    whole_gated = torch.zeros(5, hf_config["intermediate_size"])
    whole_gated[:, layout.intermediate.start:layout.intermediate.stop] = gated
    torch.testing.assert_close(sharded.model.layers[0].mlp.down(gated), whole.model.layers[0].mlp.down(
        group.all_reduce(whole_gated)), rtol=0.1, atol=0.1)


def test_fp8_shards_are_quantized_with_their_rows():
    run_on_ranks(_check_fp8_rank, 2)


def test_sizes_that_do_not_divide_the_heads_are_refused():
    config = ModelConfig.from_hf({**_TINY, **FAMILIES["llama"], "num_attention_heads": 6, "num_key_value_heads": 2})
    with pytest.raises(ValueError, match="does not divide the 6 attention heads"):
        ShardLayout(config, 0, 4)
    with pytest.raises(ValueError, match="the 2 KV heads"):
        ShardLayout(config, 0, 3)
