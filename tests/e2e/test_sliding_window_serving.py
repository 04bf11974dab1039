"""Sliding-window attention served through the real services (random weights, token ids in and out), with windows
shorter than the prompts: Mistral v0.1's window in every layer (whose blocks before the window go back to the pool)
and Qwen2's use_sliding_window past max_window_layers give Hugging Face's greedy tokens alone, forked over a small KV
pool (preemption) and 8 at once with prefix-cache hits, on one worker and at -tp 2."""
from functools import partial

import pytest

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.served_greedy import (SMALL_POOL, assert_matches_alone_and_together, assert_served_logprobs_match_hf,
                                     saved_checkpoint)
from tests.e2e.services import running_services
from tests.worker.test_model_families import _TINY
from tests.worker.test_moe_families import lively_state

pytestmark = pytest.mark.slow

PROMPTS = [[7 + i] * 20 + [i, 2 * i] for i in range(8)]  # a shared first block, then each its own
WINDOWED = {
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 8},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": True,
              "sliding_window": 8, "max_window_layers": 1},
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    configs = {family: {**_TINY, "pad_token_id": 255, **options} for family, options in WINDOWED.items()}
    return {family: saved_checkpoint(tmp_path_factory.mktemp(family), hf_config, lively_state(hf_config))
            for family, hf_config in configs.items()}


@pytest.mark.parametrize("tensor_parallel_size", [1, 2], ids=["one-worker", "tp2"])
@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_served_window_matches_hf(checkpoints, family, tensor_parallel_size):
    folder, hf = checkpoints[family]
    with running_services(folder, SMALL_POOL, router_args=["--no-tokenizer"],
                          tensor_parallel_size=tensor_parallel_size) as services:
        assert_matches_alone_and_together(services, partial(hf_greedy, hf), PROMPTS)
        assert_served_logprobs_match_hf(services, hf, PROMPTS[3])
