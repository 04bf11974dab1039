"""The in-process engine (real Scheduler + WorkerEngine; up to three steps launched ahead) against HF greedy."""
import pytest

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return [hf_tokenizer(text).input_ids for text in ("The capital of France is", "def add(a, b):",
                                                      "Three primary colours are")]


@pytest.fixture(scope="module")
def expected(hf_greedy_of, prompts) -> list[list[int]]:
    """Hugging Face's greedy tokens of the prompts (once for every number of steps in flight)."""
    return [hf_greedy_of(prompt, 24) for prompt in prompts]


@pytest.mark.parametrize("steps_in_flight", [1, 2, 3])
def test_in_process_engine_matches_hf(default_model_dir, prompts, expected, steps_in_flight):
    engine = OfflineEngine(WorkerEngine.load(WorkerConfig(model=str(default_model_dir))), num_blocks=64,
                           steps_in_flight=steps_in_flight,
                           max_num_batched_tokens=16)  # a small budget: prompts prefill in chunks beside decodes
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    results = engine.generate(prompts, [greedy] * len(prompts))
    for tokens, result in zip(expected, results):
        assert result.token_ids == tokens
        assert result.finish_reason == ("length" if len(tokens) == 24 else "stop")
