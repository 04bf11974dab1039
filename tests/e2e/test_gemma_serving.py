"""Gemma 2 and Gemma 3 served through the real services (random weights of the serving tokenizer's vocabulary, token
ids in and out), with windows shorter than the prompts in their sliding-window layers: Hugging Face's greedy tokens
alone, forked over a small KV pool (preemption) and 8 at once with prefix-cache hits, its soft-capped log
probabilities, and JSON their schema accepts, on one worker (proposing by ngram) and at -tp 2."""

import pytest

from tests.e2e.served_greedy import (ONE_WORKER_AND_TP2, SMALL_POOL, assert_family_served_like_hf, copy_tokenizer,
                                     saved_checkpoint)
from tests.e2e.services import running_services
from tests.worker.test_gemma_families import GEMMA_FAMILIES, gemma_config, lively_gemma_state

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, default_model_dir, hf_tokenizer) -> dict:
    built = {}
    for family in GEMMA_FAMILIES:
        hf_config = {**gemma_config(family), "vocab_size": len(hf_tokenizer)}
        folder = copy_tokenizer(default_model_dir, tmp_path_factory.mktemp(family))
        built[family] = saved_checkpoint(folder, hf_config, lively_gemma_state(hf_config))
    return built


@pytest.mark.parametrize("parallelism", sorted(ONE_WORKER_AND_TP2))
@pytest.mark.parametrize("family", sorted(GEMMA_FAMILIES))
def test_served_gemma_matches_hf(checkpoints, family, parallelism, hf_tokenizer):
    folder, hf = checkpoints[family]
    scheduler_args, tensor_parallel_size = ONE_WORKER_AND_TP2[parallelism]
    with running_services(folder, [*scheduler_args, *SMALL_POOL],
                          tensor_parallel_size=tensor_parallel_size) as services:
        assert_family_served_like_hf(services, hf, hf_tokenizer, proposing=bool(scheduler_args))
