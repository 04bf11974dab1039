"""Preemption and prefix caching through the three real services, checked against Hugging Face greedy output."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import running_services

MAX_NEW_TOKENS = 32
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
def references(hf_greedy_of, hf_tokenizer):
    prompts = [hf_tokenizer(p).input_ids for p in PROMPTS]
    return [(ids, hf_greedy_of(ids, MAX_NEW_TOKENS)) for ids in prompts]


def test_preemption_keeps_greedy_outputs(default_model_dir, references):
    # 12 blocks of 16 tokens hold 192 tokens; six requests of ~8 + 32 tokens need ~18 blocks at once
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


@pytest.fixture(scope="module")
def long_prompt(hf_greedy_of, hf_tokenizer):
    prompt = hf_tokenizer("Each rule of chess, one by one, in the order a beginner meets them. " * 14
                          + "Summarise the rules of chess.").input_ids
    return prompt, hf_greedy_of(prompt, MAX_NEW_TOKENS)


def _assert_second_run_cached(services, long_prompt, num_cached: int) -> None:
    prompt, expected = long_prompt
    first = services.client.generate(_request(prompt))
    second = services.client.generate(_request(prompt))
    assert first.token_ids == second.token_ids == expected
    assert first.usage["cached_tokens"] == 0
    assert second.usage["cached_tokens"] == num_cached


def test_prefix_caching_serves_a_repeated_prompt_from_cache_and_matches_hf(services, long_prompt):
    _assert_second_run_cached(services, long_prompt, (len(long_prompt[0]) - 1) // 16 * 16)


def test_without_prefix_caching_a_repeated_prompt_is_computed_again_and_matches_hf(default_model_dir, long_prompt):
    with running_services(default_model_dir, scheduler_args=["--no-prefix-caching"]) as services:
        _assert_second_run_cached(services, long_prompt, 0)
