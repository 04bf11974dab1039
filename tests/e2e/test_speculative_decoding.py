"""Speculative decoding through the real services on the CPU with SmolLM2, by ngram and by a draft model (SmolLM2
drafting for itself, which is nearly always right, and a random two-layer draft of its vocabulary, which nearly never
is): greedy output is Hugging Face's token for token (as without speculation, see test_greedy_matches_hf), one
request alone and several at once in a KV pool small enough to force preemptions, and n = 2; a seeded sampled
request draws the same tokens again; proposals the grammar of a structured-output request rejects are rejected;
every token taken in a verification comes with Hugging Face's logprobs;
a stop string inside a step's accepted tokens cuts the text there; the scheduler
reports what was proposed and what was accepted, in GetLoad and in the vllm:spec_decode_* series. One service stack
per method and draft model."""
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sluice.v1 import generation_pb2 as pb
from tests.e2e.hf_reference import assert_logprobs_match_hf, hf_constrained_greedy
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow

NUM_SPECULATIVE_TOKENS = ["--num-speculative-tokens", "4"]
NGRAM = ["--speculative-method", "ngram", *NUM_SPECULATIVE_TOKENS, "--ngram-min", "1", "--ngram-max", "3"]
DRAFT = ["--speculative-method", "draft", *NUM_SPECULATIVE_TOKENS]
TINY_DRAFT = ["--draft-model", "SmolLM2-tiny", "--draft-load-format", "dummy"]
SMALL_POOL = ["--num-blocks", "6", "--block-size", "16"]  # fewer than 6 requests of 2 blocks need
PARAGRAPH = ("The river rises in the northern hills, runs south through three market towns, and meets the sea at a "
             "wide, shallow bay where herons feed at low tide.")
QUOTING = f"Repeat the following paragraph word for word.\nParagraph: {PARAGRAPH}\nRepeated: The river rises"
LOWERCASE_WORDS = "[a-z ]+"  # the paragraph's comma, which both methods propose, is not allowed
NEXT_WORDS = " in the northern hills"  # the paragraph's next words, which the proposals carry
SHORT_QUOTES = [f"Say it twice: {fact}. Again: {fact.split()[0]}" for fact in (
    "red apples fall", "the sun is warm", "cats like milk", "rain makes mud", "bees make honey", "owls hunt at night")]


def _request(prompt_ids: list[int], max_tokens: int, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids),
                              sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling))


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return [hf_tokenizer(QUOTING).input_ids] + [hf_tokenizer(text).input_ids for text in SHORT_QUOTES]


@pytest.fixture(scope="module")
def expected(prompts, hf_greedy_of) -> list[list[int]]:
    """Hugging Face's greedy tokens: 24 of QUOTING, 16 of each short quote (once for every method)."""
    return [hf_greedy_of(prompt, 24 if i == 0 else 16) for i, prompt in enumerate(prompts)]


@pytest.fixture(scope="module")
def constrained(prompts, hf_model, hf_tokenizer) -> dict[str, list[int]]:
    """Hugging Face's greedy tokens of QUOTING under LOWERCASE_WORDS and under NEXT_WORDS (once for every method)."""
    return {regex: hf_constrained_greedy(hf_model, hf_tokenizer, regex, prompts[0], 24)
            for regex in (LOWERCASE_WORDS, NEXT_WORDS)}


@pytest.fixture(scope="module")
def penalised(prompts, hf_model) -> list[int]:
    """Hugging Face's greedy 24 tokens of QUOTING under a repetition penalty of 1.1 (once for every method)."""
    with torch.inference_mode():
        return hf_model.generate(torch.tensor([prompts[0]]), max_new_tokens=24, do_sample=False,
                                 repetition_penalty=1.1)[0, len(prompts[0]):].tolist()


@pytest.fixture(scope="module", params=["ngram", "self-draft"])
def speculating(request, default_model_dir):
    scheduler_args, worker_args = (NGRAM, []) if request.param == "ngram" else \
        (DRAFT, ["--draft-model", str(default_model_dir)])
    with running_services(default_model_dir, [*scheduler_args, *SMALL_POOL], worker_args) as services:
        yield services


def test_greedy_output_matches_hf_alone_and_together_through_preemptions(speculating, prompts, expected):
    _check_greedy_output(speculating, prompts, expected, mostly_accepted=True)


def test_a_random_draft_is_almost_never_accepted_and_changes_no_token(default_model_dir, prompts, expected):
    with running_services(default_model_dir, [*DRAFT, *SMALL_POOL], TINY_DRAFT) as services:
        _check_greedy_output(services, prompts, expected, mostly_accepted=False)


def _check_greedy_output(services, prompts: list[list[int]], expected: list[list[int]], mostly_accepted: bool):
    before = services.load()
    assert services.client.generate(_request(prompts[0], 24)).token_ids == expected[0]
    alone = services.load()
    assert alone.num_draft_tokens > before.num_draft_tokens
    if mostly_accepted:
        assert alone.num_accepted_tokens - before.num_accepted_tokens >= 12  # the paragraph is mostly accepted
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda i: services.client.generate(_request(prompts[i], 24 if i == 0 else 16)),
                                range(len(prompts))))
    assert [result.token_ids for result in results] == expected
    load = services.wait_until_idle()
    assert load.num_preemptions > 0 and load.num_free_blocks == load.num_total_blocks
    acceptance = load.num_accepted_tokens / load.num_draft_tokens
    assert acceptance > 0.5 if mostly_accepted else acceptance < 0.1
    assert sum(load.num_accepted_tokens_per_position) == load.num_accepted_tokens
    assert len(load.num_accepted_tokens_per_position) == 4


def test_a_seeded_sampled_request_draws_the_same_tokens_again(speculating, prompts):
    request = _request(prompts[0], 16)
    request.sampling.temperature, request.sampling.seed = 0.8, 7
    first = speculating.client.generate(request).token_ids
    assert len(first) == 16 and speculating.client.generate(request).token_ids == first


def test_two_greedy_samples_both_match_hf(speculating, prompts, expected):
    samples = speculating.client.generate_samples(_request(prompts[0], 20, n=2))
    assert [sample.token_ids for sample in samples] == [expected[0][:20]] * 2


def test_a_stop_string_inside_accepted_tokens_ends_the_text_there(speculating, prompts, expected, hf_tokenizer):
    full = hf_tokenizer.decode(expected[0])
    assert "three market" in full
    result = speculating.client.generate(_request(prompts[0], 24, stop=["three market"]))
    assert result.text == full[:full.index("three market")] and result.finish_reason == "stop"


def test_acceptance_series_in_metrics(speculating, prompts):
    speculating.client.generate(_request(prompts[0], 16))
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


def test_structured_output_rejects_the_proposals_its_grammar_does_not_allow(speculating, prompts, expected, constrained,
                                                                           hf_tokenizer):
    """The paragraph goes on with a comma after "hills": ngram proposes it from the prompt, SmolLM2 drafting for
    itself predicts it, and the grammar allows none; the output is Hugging Face's greedy choice under the grammar's
    masks, token for token, with the proposals before the comma accepted."""
    comma = hf_tokenizer(",", add_special_tokens=False).input_ids[0]
    assert comma in expected[0]
    reference = constrained[LOWERCASE_WORDS]
    assert comma not in reference and reference[:expected[0].index(comma)] == expected[0][:expected[0].index(comma)]
    before = speculating.load()
    result = speculating.client.generate(_request(prompts[0], 24, regex=LOWERCASE_WORDS))
    assert result.token_ids == reference
    after = speculating.wait_until_idle()
    assert after.num_accepted_tokens - before.num_accepted_tokens >= 3
    assert after.num_draft_tokens - before.num_draft_tokens > after.num_accepted_tokens - before.num_accepted_tokens
    assert after.num_free_blocks == after.num_total_blocks


def test_a_grammar_that_accepted_proposals_complete_ends_the_output_there(speculating, prompts, constrained,
                                                                          hf_tokenizer):
    """The grammar admits only the paragraph's next words, which the proposals carry: the step that accepts them
    completes the grammar, and the output ends at its last word, as without speculation."""
    reference = constrained[NEXT_WORDS]
    assert hf_tokenizer.decode(reference) == NEXT_WORDS
    before = speculating.load()
    result = speculating.client.generate(_request(prompts[0], 24, regex=NEXT_WORDS, logprobs=1))
    assert (result.token_ids, result.finish_reason) == (reference, "stop")
    assert [entry.token_id for entry in result.logprobs] == reference
    assert speculating.wait_until_idle().num_accepted_tokens - before.num_accepted_tokens >= 2


def test_logprobs_of_accepted_proposals_and_the_token_after_match_hf(speculating, prompts, expected, hf_model,
                                                                     hf_tokenizer):
    before = speculating.load()
    result = speculating.client.generate(_request(prompts[0], 24, logprobs=3))
    assert list(result.token_ids) == expected[0]
    assert_logprobs_match_hf(result, prompts[0], 3, None, hf_model, hf_tokenizer)
    assert speculating.wait_until_idle().num_accepted_tokens - before.num_accepted_tokens >= 12


def test_greedy_output_with_a_repetition_penalty_matches_hf(speculating, prompts, penalised, request):
    """ngram proposes for a penalised request, whose verification rows count the proposals before them; the draft
    method proposes nothing for it."""
    before = speculating.load()
    result = speculating.client.generate(_request(prompts[0], 24, repetition_penalty=1.1))
    assert list(result.token_ids) == penalised
    after = speculating.wait_until_idle()
    if request.node.callspec.params["speculating"] == "ngram":
        assert after.num_accepted_tokens - before.num_accepted_tokens >= 3
    else:
        assert after.num_draft_tokens == before.num_draft_tokens
