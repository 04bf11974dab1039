"""Phi-3 served through the real services (random weights of the serving tokenizer's vocabulary, published as Phi-3
publishes them, q/k/v and gate/up fused; token ids in and out): Phi-4-mini's partial rotary, tied embeddings and
LongRoPE below its switch (a max model length within original_max_position_embeddings), and Phi-3's LongRoPE past it
(prompts longer than that), give Hugging Face's greedy tokens alone, forked over a small KV pool (preemption) and 8 at
once with prefix-cache hits, and JSON their schema accepts, on one worker (proposing by ngram) and at -tp 2 (each
rank reading its heads' rows of the fused projections)."""

import pytest

from tests.e2e.served_greedy import (ONE_WORKER_AND_TP2, SMALL_POOL, assert_family_served_like_hf, copy_tokenizer,
                                     saved_checkpoint)
from tests.e2e.services import running_services
from tests.worker.test_moe_families import lively_state
from tests.worker.test_phi3_family import ORIGINAL_MAX, PHI3_FAMILIES, TINY_PHI3

pytestmark = pytest.mark.slow

SERVED = {  # the config, and the scheduler's flags
    "phi4-mini": (PHI3_FAMILIES["phi4-mini"], ["--max-model-len", str(ORIGINAL_MAX)]),  # every request below it
    "phi3-longrope": ({**PHI3_FAMILIES["phi3-longrope"], "original_max_position_embeddings": 16}, []),  # 22 > 16
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, default_model_dir, hf_tokenizer) -> dict:
    built = {}
    for family, (options, _) in SERVED.items():
        hf_config = {**TINY_PHI3, **options, "vocab_size": len(hf_tokenizer)}
        folder = copy_tokenizer(default_model_dir, tmp_path_factory.mktemp(family))
        built[family] = saved_checkpoint(folder, hf_config, lively_state(hf_config))
    return built


@pytest.mark.parametrize("parallelism", sorted(ONE_WORKER_AND_TP2))
@pytest.mark.parametrize("family", sorted(SERVED))
def test_served_phi3_matches_hf(checkpoints, family, parallelism, hf_tokenizer):
    folder, hf = checkpoints[family]
    scheduler_args, tensor_parallel_size = ONE_WORKER_AND_TP2[parallelism]
    with running_services(folder, [*scheduler_args, *SMALL_POOL, *SERVED[family][1]],
                          tensor_parallel_size=tensor_parallel_size) as services:
        assert_family_served_like_hf(services, hf, hf_tokenizer, proposing=bool(scheduler_args))
