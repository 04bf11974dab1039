"""SmolLM2-135M on the CPU with its KV cache in FP8 (scales 1.0: the checkpoint has none) against the same model's
float32 cache. Measured (BENCHMARKS.md): logit cosine mean 0.996 / min 0.974, mean KL 0.015, log-likelihood -1.4%,
and the first 3 greedy tokens identical on 10 of 10 prompts."""
import pytest
import torch
import torch.nn.functional as F

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.e2e.test_greedy_matches_hf import PROMPTS
from tests.worker.stepping import prompt_logits, run_greedy
from tests.worker.test_fp8_accuracy import TEXT, _log_likelihood


@pytest.fixture(scope="module")
def engines(default_model_dir):
    return tuple(WorkerEngine.load(WorkerConfig(model=str(default_model_dir), kv_cache_dtype=kv_cache_dtype))
                 for kv_cache_dtype in ("auto", "fp8"))


def test_logits_stay_close(engines, hf_tokenizer):
    ids = hf_tokenizer(TEXT).input_ids
    exact, fp8 = (prompt_logits(engine, ids) for engine in engines)
    assert F.cosine_similarity(exact, fp8, dim=-1).mean() >= 0.99
    kl = F.kl_div(torch.log_softmax(fp8, -1), torch.log_softmax(exact, -1), log_target=True, reduction="none")
    assert kl.sum(-1).mean() < 0.05
    assert abs(_log_likelihood(fp8, ids) / _log_likelihood(exact, ids) - 1) < 0.05
    assert not torch.equal(exact, fp8)


def test_greedy_starts_the_same(engines, hf_tokenizer):
    prompts = [hf_tokenizer(p).input_ids for p in [*PROMPTS, "def quicksort(xs):"]]
    exact, fp8 = (run_greedy(engine, prompts, 3, chunk=1000) for engine in engines)
    assert sum(a == b for a, b in zip(exact, fp8)) >= 9
