"""Preemption and prefix caching through the three real services, checked against Hugging Face greedy output."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.v1 import generation_pb2 as pb
from tests.e2e.hf_reference import hf_greedy
from tests.e2e.services import running_services

MAX_NEW_TOKENS = 48
PROMPTS = [
    "The history of the Roman Empire began",
    "A recipe for pancakes: first,",
    "The three laws of motion are",
    "Python is a programming language that",
    "The quick brown fox",
    "Photosynthesis is the process by which",
]


def _request(prompt_ids: list[int], **sampling) -> pb.GenerateRequest:
    params = pb.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, **sampling)
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids), sampling=params)


@pytest.fixture(scope="module")
def references(hf_model, hf_tokenizer):
    prompts = [hf_tokenizer(p).input_ids for p in PROMPTS]
    return [(ids, hf_greedy(hf_model, ids, MAX_NEW_TOKENS)) for ids in prompts]


def test_preemption_keeps_greedy_outputs(default_model_dir, references):
    # 12 blocks of 16 tokens hold 192 tokens; six requests of ~8 + 48 tokens need ~24 blocks at once
    with running_services(default_model_dir, scheduler_args=["--num-blocks", "12"]) as services:
        with ThreadPoolExecutor(len(references)) as pool:
            results = list(pool.map(lambda ref: services.client.generate(_request(ref[0], ignore_eos=True)),
                                    references))
        load = services.load()
    assert load.num_preemptions > 0
    assert load.num_free_blocks == load.num_total_blocks
    for (prompt_ids, expected), got in zip(references, results):
        assert got.token_ids[:len(expected)] == expected[:len(got.token_ids)]
        assert len(got.token_ids) == MAX_NEW_TOKENS


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_prefix_caching_on_and_off_both_match_hf(default_model_dir, hf_model, hf_tokenizer, prefix_caching):
    long_prompt = hf_tokenizer("You are a careful assistant. " * 30 + "Summarise the rules of chess.").input_ids
    expected = hf_greedy(hf_model, long_prompt, MAX_NEW_TOKENS)
    flags = [] if prefix_caching else ["--no-prefix-caching"]
    with running_services(default_model_dir, scheduler_args=flags) as services:
        first = services.client.generate(_request(long_prompt))
        second = services.client.generate(_request(long_prompt))
    assert first.token_ids == second.token_ids == expected
    assert first.usage["cached_tokens"] == 0
    full_prompt_blocks = (len(long_prompt) - 1) // 16 * 16
    assert second.usage["cached_tokens"] == (full_prompt_blocks if prefix_caching else 0)
