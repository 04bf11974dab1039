"""Piecewise CUDA graphs (graphs between eager attention calls) against the eager pass on one GPU: steps that carry
prefill chunks with and without cached context, decode tokens beside them, and padding rows whose stale slots must
write no KV."""
import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.models.rope import build_cos_sin_cache
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.kv_cache import allocate_kv_cache
from sluice.worker.runner.piecewise_graphs import MAX_CAPTURED_TOKENS, PiecewiseGraphs, token_count_ladder

BLOCK_SIZE, MAX_BLOCKS = 16, 8


def test_ladder_covers_every_captured_token_count_with_bounded_padding():
    ladder = token_count_ladder(8192)
    assert ladder == sorted(set(ladder)) and ladder[0] == 8 and ladder[-1] == MAX_CAPTURED_TOKENS
    for num_tokens in range(65, MAX_CAPTURED_TOKENS + 1):
        bucket = next(size for size in ladder if size >= num_tokens)
        assert bucket - num_tokens < num_tokens / 4
    assert token_count_ladder(100)[-1] == 100 and token_count_ladder(4) == [4]


def _step(chunks: list[tuple[int, int]], vocab_size: int, generator: torch.Generator):
    """The step's token inputs and metadata; chunks: (tokens already cached, tokens in this step) per sequence, each
    sequence in blocks of its own."""
    positions, slots, seq_index, query_pos = [], [], [], []
    for seq, (cached, new) in enumerate(chunks):
        for j, position in enumerate(range(cached, cached + new)):
            positions.append(position)
            slots.append((seq * MAX_BLOCKS + position // BLOCK_SIZE) * BLOCK_SIZE + position % BLOCK_SIZE)
            seq_index.append(seq)
            query_pos.append(j)
    ids = torch.randint(0, vocab_size, (len(positions),), generator=generator).tolist()
    token_inputs = torch.tensor([ids, positions, slots], device="cuda")
    query_lens = [new for _, new in chunks]
    meta = AttentionMetadata(
        slot_mapping=token_inputs[2],
        query_start_loc=torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32,
                                     device="cuda"),
        seq_lens=torch.tensor([cached + new for cached, new in chunks], dtype=torch.int32, device="cuda"),
        block_tables=torch.arange(len(chunks) * MAX_BLOCKS, dtype=torch.int32, device="cuda").view(-1, MAX_BLOCKS),
        token_seq_index=torch.tensor(seq_index, device="cuda"), token_query_pos=torch.tensor(query_pos, device="cuda"),
        max_query_len=max(query_lens), max_seq_len=max(cached + new for cached, new in chunks))
    return token_inputs, meta


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_piecewise_pass_matches_eager_pass(dtype, tolerance):
    worker = WorkerEngine.load(WorkerConfig(model="Qwen3-0.6B", load_format="dummy", dtype=dtype, device="cuda"))
    model, config = worker.model, worker.model_config
    cos_sin_cache = build_cos_sin_cache(config.rotary_dim, 1024, config.rope_theta, config.rope_scaling,
                                        torch.float32).cuda()
    eager_caches, graph_caches = (allocate_kv_cache(config, 3 * MAX_BLOCKS, BLOCK_SIZE, worker.kv_cache_dtype,
                                                    torch.device("cuda")) for _ in range(2))
    graphs = PiecewiseGraphs(model, graph_caches, cos_sin_cache, 64, torch.device("cuda"))
    generator = torch.Generator().manual_seed(0)
    # 37 tokens (bucket 48), then 21 (bucket 32: rows 21-36 still hold the first step's slots), then 11 (bucket 16)
    for chunks in ([(0, 30), (0, 7)], [(30, 20), (7, 1)], [(50, 1), (8, 1), (0, 9)]):
        token_inputs, meta = _step(chunks, config.vocab_size, generator)
        with torch.inference_mode():
            expected = model.hidden_states(token_inputs[0], token_inputs[1], cos_sin_cache, eager_caches, meta, None)
            actual = graphs.run(token_inputs, meta)
        for actual_part, expected_part in zip(actual, expected):
            assert actual_part.shape == expected_part.shape
            assert _relative_error(actual_part, expected_part) < tolerance
        for (graph_keys, graph_values), (eager_keys, eager_values) in zip(graph_caches, eager_caches):
            assert _relative_error(graph_keys, eager_keys) < tolerance
            assert _relative_error(graph_values, eager_values) < tolerance
            assert torch.equal(graph_keys.float() == 0, eager_keys.float() == 0)  # no slot written by padding
