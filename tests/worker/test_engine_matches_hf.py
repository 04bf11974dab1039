"""The worker engine in process, stepped by hand with chunked prefill, against Hugging Face transformers."""
import pytest
import torch

from sluice.cli.model_store import default_gguf_path
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.worker.stepping import run_greedy


@pytest.fixture(scope="module")
def prompts(hf_tokenizer):
    texts = ["The capital of France is", "def quicksort(xs):", "A long time ago in a galaxy far, far away, there"]
    return [hf_tokenizer(t).input_ids for t in texts]


@pytest.fixture(scope="module")
def expected(hf_greedy_of, prompts) -> list[list[int]]:
    """Hugging Face's greedy tokens of the prompts (once for every chunk size)."""
    return [hf_greedy_of(p, 24) for p in prompts]


@pytest.mark.parametrize("chunk", [1000, 5])
def test_batched_chunked_prefill_matches_hf(default_model_dir, prompts, expected, chunk):
    engine = WorkerEngine.load(WorkerConfig(model=str(default_model_dir)))
    got = run_greedy(engine, prompts, 24, chunk)
    assert [g[:len(e)] for g, e in zip(got, expected)] == expected


def test_gguf_file_loads_the_same_weights(default_model_dir):
    from_folder = WorkerEngine.load(WorkerConfig(model=str(default_model_dir)))
    from_gguf = WorkerEngine.load(WorkerConfig(model=str(default_gguf_path(default_model_dir.parents[1]))))
    for (name, a), b in zip(from_folder.model.state_dict().items(), from_gguf.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_bfloat16_stays_close_to_float32(default_model_dir, prompts):
    bf16 = WorkerEngine.load(WorkerConfig(model=str(default_model_dir), dtype="bfloat16"))
    fp32 = WorkerEngine.load(WorkerConfig(model=str(default_model_dir)))
    got_bf16 = run_greedy(bf16, prompts, 8, 1000)
    got_fp32 = run_greedy(fp32, prompts, 8, 1000)
    agreeing = sum(a == b for x, y in zip(got_bf16, got_fp32) for a, b in zip(x[:4], y[:4]))
    assert agreeing >= 10
