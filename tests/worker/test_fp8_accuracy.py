"""SmolLM2-135M's real weights in FP8 (the CPU's emulated GEMM) against the same model unquantized."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.e2e.test_greedy_matches_hf import PROMPTS
from tests.worker.stepping import prompt_logits, run_greedy

TEXT = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is the capital of "
        "Germany. Water boils at one hundred degrees Celsius at sea level.")
SCORED_PASSAGE = Path(__file__).parent / "scored_passage.txt"  # 453 tokens of prose and code


@pytest.fixture(scope="module")
def engines(default_model_dir):
    return (WorkerEngine.load(WorkerConfig(model=str(default_model_dir))),
            WorkerEngine.load(WorkerConfig(model=str(default_model_dir), quantization="fp8")))


def _log_likelihood(logits: torch.Tensor, ids: list[int]) -> float:
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None]).sum().item()


def test_logits_and_log_likelihood_stay_close(engines, hf_tokenizer):
    """Measured: logit cosine mean 0.995, KL mean 0.029, log-likelihood 0.29% below the float model's."""
    ids = hf_tokenizer(SCORED_PASSAGE.read_text()).input_ids
    exact, fp8 = (prompt_logits(engine, ids) for engine in engines)
    assert engines[1].model.layers[0].mlp.down_proj.weight.dtype == torch.float8_e4m3fn
    assert F.cosine_similarity(exact, fp8, dim=-1).mean() >= 0.99
    kl = F.kl_div(torch.log_softmax(fp8, -1), torch.log_softmax(exact, -1), log_target=True, reduction="none")
    assert kl.sum(-1).mean() < 0.05
    assert abs(_log_likelihood(fp8, ids) / _log_likelihood(exact, ids) - 1) < 0.01


def test_greedy_starts_the_same(engines, hf_tokenizer):
    prompts = [hf_tokenizer(p).input_ids for p in [*PROMPTS, "def quicksort(xs):"]]
    exact, fp8 = (run_greedy(engine, prompts, 3, chunk=1000) for engine in engines)
    assert sum(a == b for a, b in zip(exact, fp8)) >= 8
