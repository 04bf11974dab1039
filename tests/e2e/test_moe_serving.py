"""The mixtures of experts served through the real services (random weights, token ids in and out): Qwen3-MoE,
Qwen2-MoE, Mixtral and OLMoE give Hugging Face's greedy tokens alone, forked over a small KV pool (preemption) and
8 at once with prefix-cache hits, on one worker, at -tp 2 (every expert's intermediate size split) and at -tp 2 with
--enable-expert-parallel (whole experts on each rank)."""
from functools import partial

import pytest
import torch

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.served_greedy import SMALL_POOL, assert_matches_alone_and_together, assert_served_logprobs_match_hf
from tests.e2e.services import running_services
from tests.worker.test_moe_families import MOE_FAMILIES, write_tiny_moe

pytestmark = pytest.mark.slow

PROMPTS = [[7 + i] * 20 + [i, 2 * i] for i in range(8)]  # a shared first block, then each its own
PARALLELISM = {"one-worker": ((), 1), "tp2": ((), 2), "tp2-expert-parallel": (("--enable-expert-parallel",), 2)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    from transformers import AutoModelForCausalLM

    built = {}
    for family in MOE_FAMILIES:
        folder = write_tiny_moe(tmp_path_factory.mktemp(family), family)
        built[family] = folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return built


@pytest.mark.parametrize("parallelism", sorted(PARALLELISM))
@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_served_moe_matches_hf(checkpoints, family, parallelism):
    folder, hf = checkpoints[family]
    worker_args, tensor_parallel_size = PARALLELISM[parallelism]
    with running_services(folder, SMALL_POOL, worker_args, router_args=["--no-tokenizer"],
                          tensor_parallel_size=tensor_parallel_size) as services:
        assert_matches_alone_and_together(services, partial(hf_greedy, hf), PROMPTS)
        assert_served_logprobs_match_hf(services, hf, PROMPTS[3])
