"""The mixtures of experts served through the real services (random weights of the serving tokenizer's vocabulary,
token ids in and out): Qwen3-MoE, Qwen2-MoE, Mixtral and OLMoE give Hugging Face's greedy tokens alone, forked over a
small KV pool (preemption) and 8 at once with prefix-cache hits, and JSON their schema accepts, on one worker
(proposing by ngram), at -tp 2 (every expert's intermediate size split) and at -tp 2 with --enable-expert-parallel
(whole experts on each rank)."""

import pytest
import torch

from tests.e2e.served_greedy import NGRAM, SMALL_POOL, assert_family_served_like_hf, copy_tokenizer
from tests.e2e.services import running_services
from tests.worker.test_moe_families import MOE_FAMILIES, write_tiny_moe

pytestmark = pytest.mark.slow

PARALLELISM = {  # scheduler flags, worker flags, ranks
    "one-worker-ngram": (NGRAM, (), 1),
    "tp2": ((), (), 2),
    "tp2-expert-parallel": ((), ("--enable-expert-parallel",), 2),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, default_model_dir, hf_tokenizer) -> dict:
    from transformers import AutoModelForCausalLM

    built = {}
    for family in MOE_FAMILIES:
        folder = write_tiny_moe(tmp_path_factory.mktemp(family), family, vocab_size=len(hf_tokenizer))
        built[family] = (copy_tokenizer(default_model_dir, folder),
                         AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval())
    return built


@pytest.mark.parametrize("parallelism", sorted(PARALLELISM))
@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_served_moe_matches_hf(checkpoints, family, parallelism, hf_tokenizer):
    folder, hf = checkpoints[family]
    scheduler_args, worker_args, tensor_parallel_size = PARALLELISM[parallelism]
    with running_services(folder, [*scheduler_args, *SMALL_POOL], worker_args,
                          tensor_parallel_size=tensor_parallel_size) as services:
        assert_family_served_like_hf(services, hf, hf_tokenizer, proposing=bool(scheduler_args))
