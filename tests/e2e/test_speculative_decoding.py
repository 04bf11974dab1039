"""ngram speculative decoding through the real services on the CPU with SmolLM2: greedy output is Hugging Face's
token for token (as without speculation, see test_greedy_matches_hf), one request alone, several at once, n = 2,
and with preemptions forced by a small KV pool; a stop string inside a step's accepted tokens cuts the text there;
the scheduler reports what it proposed and what was accepted, in GetLoad and in the vllm:spec_decode_* series."""
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.v1 import generation_pb2 as pb
from tests.e2e.hf_reference import hf_greedy
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow

SPECULATION = ["--speculative-method", "ngram", "--num-speculative-tokens", "4", "--ngram-min", "1",
               "--ngram-max", "3"]
SMALL_POOL = ["--num-blocks", "6", "--block-size", "16"]  # fewer than 6 requests of 2 blocks need
PARAGRAPH = ("The river rises in the northern hills, runs south through three market towns, and meets the sea at a "
             "wide, shallow bay where herons feed at low tide.")
QUOTING = f"Repeat the following paragraph word for word.\nParagraph: {PARAGRAPH}\nRepeated: The river rises"
SHORT_QUOTES = [f"Say it twice: {fact}. Again: {fact.split()[0]}" for fact in (
    "red apples fall", "the sun is warm", "cats like milk", "rain makes mud", "bees make honey", "owls hunt at night")]


def _request(prompt_ids: list[int], max_tokens: int, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids),
                              sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling))


@pytest.fixture(scope="module")
def speculating(default_model_dir):
    with running_services(default_model_dir, SPECULATION) as services:
        yield services


def test_greedy_output_matches_hf_alone_and_together(speculating, hf_model, hf_tokenizer):
    prompts = [hf_tokenizer(QUOTING).input_ids] + [hf_tokenizer(text).input_ids for text in SHORT_QUOTES]
    expected = [hf_greedy(hf_model, prompt, 24) for prompt in prompts]
    before = speculating.load()
    assert speculating.client.generate(_request(prompts[0], 24)).token_ids == expected[0]
    alone = speculating.load()
    assert alone.num_accepted_tokens - before.num_accepted_tokens >= 12  # the paragraph is mostly accepted
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda prompt: speculating.client.generate(_request(prompt, 24)), prompts))
    assert [result.token_ids for result in results] == expected
    load = speculating.wait_until_idle()
    assert load.num_free_blocks == load.num_total_blocks
    assert 0 < load.num_accepted_tokens < load.num_draft_tokens
    assert sum(load.num_accepted_tokens_per_position) == load.num_accepted_tokens
    assert len(load.num_accepted_tokens_per_position) == 4


def test_two_greedy_samples_both_match_hf(speculating, hf_model, hf_tokenizer):
    prompt = hf_tokenizer(QUOTING).input_ids
    samples = speculating.client.generate_samples(_request(prompt, 20, n=2))
    assert [sample.token_ids for sample in samples] == [hf_greedy(hf_model, prompt, 20)] * 2


def test_a_stop_string_inside_accepted_tokens_ends_the_text_there(speculating, hf_model, hf_tokenizer):
    prompt = hf_tokenizer(QUOTING).input_ids
    full = hf_tokenizer.decode(hf_greedy(hf_model, prompt, 24))
    assert "three market" in full
    result = speculating.client.generate(_request(prompt, 24, stop=["three market"]))
    assert result.text == full[:full.index("three market")] and result.finish_reason == "stop"


def test_acceptance_series_in_metrics(speculating, hf_tokenizer):
    speculating.client.generate(_request(hf_tokenizer(QUOTING).input_ids, 16))
    load = speculating.wait_until_idle()
    with urllib.request.urlopen(speculating.metrics_url("scheduler"), timeout=5) as response:
        lines = response.read().decode().splitlines()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:spec")}
    model = next(key for key in values if key.startswith("vllm:spec_decode_num_draft_tokens_total")).split("{")[1]
    assert values[f"vllm:spec_decode_num_draft_tokens_total{{{model}"] == load.num_draft_tokens
    assert values[f"vllm:spec_decode_num_accepted_tokens_total{{{model}"] == load.num_accepted_tokens
    assert values[f"vllm:spec_decode_num_drafts_total{{{model}"] > 0
    first_position = next(value for key, value in values.items()
                          if key.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total") and
                          'position="0"' in key)
    assert first_position == load.num_accepted_tokens_per_position[0] > 0


def test_preemptions_keep_greedy_output_and_free_every_block(default_model_dir, hf_model, hf_tokenizer):
    prompts = [hf_tokenizer(text).input_ids for text in SHORT_QUOTES]
    expected = [hf_greedy(hf_model, prompt, 16) for prompt in prompts]
    with running_services(default_model_dir, [*SPECULATION, *SMALL_POOL]) as services:
        with ThreadPoolExecutor(len(prompts)) as pool:
            results = list(pool.map(lambda prompt: services.client.generate(_request(prompt, 16)), prompts))
        assert [result.token_ids for result in results] == expected
        load = services.wait_until_idle()
        assert load.num_preemptions > 0 and load.num_accepted_tokens > 0
        assert load.num_free_blocks == load.num_total_blocks
