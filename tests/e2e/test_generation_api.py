"""The generation controls through the three real services: structured output, stop strings, n > 1, seeds,
logprobs, penalties and biases (greedy ones against Hugging Face transformers)."""
import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest
import torch

from sluice.client import chat_request, sampling_params, text_request
from sluice.v1 import generation_pb2 as pb
from tests.e2e.hf_reference import assert_logprobs_match_hf

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PHONE = r"\(\d{3}\) \d{3}-\d{4}"


def _all(services, requests: list[pb.GenerateRequest]):
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(services.client.generate, requests))


def _tokens_request(prompt_ids: list[int], **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids), sampling=sampling_params(**sampling))


def test_json_schema_output_always_parses_and_validates(services):
    requests = [chat_request("Describe a person as JSON.", json_schema=json.dumps(PERSON_SCHEMA), temperature=1.0,
                             seed=seed, max_tokens=80) for seed in range(20)]
    for result in _all(services, requests):
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), PERSON_SCHEMA)


def test_regex_output_always_matches(services):
    requests = [text_request("Call me at", regex=PHONE, temperature=1.0, seed=seed, max_tokens=30)
                for seed in range(10)]
    for result in _all(services, requests):
        assert result.finish_reason == "stop"
        assert re.fullmatch(PHONE, result.text), result.text


def test_choice_and_lark_grammar_end_with_stop(services):
    choices = ["Paris", "London", "Berlin"]
    requests = [chat_request("What is the capital of France?", choice=choices, temperature=1.0, seed=seed)
                for seed in range(5)]
    requests.append(text_request("Answer yes or no:", grammar='start: "yes" | "no"', temperature=1.0, seed=1))
    results = _all(services, requests)
    assert all(result.text in choices for result in results[:-1])
    assert results[-1].text in ("yes", "no")
    assert {result.finish_reason for result in results} == {"stop"}


@pytest.fixture(scope="module")
def greedy_story(services, hf_tokenizer):
    """A greedy continuation and a stop string that straddles the boundary between two of its tokens."""
    result = services.client.generate(text_request("Once upon a time, in a small village,", max_tokens=32,
                                                   temperature=0.0, ignore_eos=True))
    for boundary in range(8, len(result.token_ids) - 1):
        before = hf_tokenizer.decode(result.token_ids[:boundary])
        after = hf_tokenizer.decode(result.token_ids[:boundary + 1])
        stop = before[-3:] + after[len(before):len(before) + 3]
        if len(stop) == 6 and result.text.find(stop) == len(before) - 3:
            return result, stop, boundary
    raise AssertionError(f"no boundary to straddle in {result.text!r}")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_split_across_tokens_is_caught(services, greedy_story, include):
    full, stop, boundary = greedy_story
    request = text_request("Once upon a time, in a small village,", max_tokens=32, temperature=0.0, ignore_eos=True,
                           stop=["no such text", stop], include_stop_str_in_output=include)
    result = services.client.generate(request)
    end = full.text.index(stop) + (len(stop) if include else 0)
    assert result.text == full.text[:end]
    assert result.finish_reason == "stop"
    assert result.token_ids == full.token_ids[:boundary + 1]
    assert result.usage["completion_tokens"] == boundary + 1


def test_n_greedy_samples_are_indexed_and_all_match_hf(services, hf_greedy_of, hf_tokenizer):
    # 38 prompt tokens: two full blocks shared by the samples, a partial third copied for each
    prompt_ids = hf_tokenizer("Write a short note to a friend about the weather today, the trip you are planning "
                              "next summer and the book you are reading now:").input_ids
    assert len(prompt_ids) % 16 not in (0, 1)
    samples = services.client.generate_samples(_tokens_request(prompt_ids, n=3, temperature=0.0, max_tokens=24))
    expected = hf_greedy_of(prompt_ids, 24)
    assert [sample.index for sample in samples] == [0, 1, 2]
    for sample in samples:
        assert sample.token_ids == expected
        assert sample.usage["prompt_tokens"] == len(prompt_ids)
        assert sample.usage["completion_tokens"] == len(expected)


def test_n_seeded_samples_differ_and_reproduce(services):
    request = text_request("My favourite animal is", n=4, temperature=1.0, seed=5, max_tokens=16)
    first = services.client.generate_samples(request)
    again = services.client.generate_samples(request)
    assert len(first) == 4 and len({sample.text for sample in first}) > 1
    assert [sample.token_ids for sample in first] == [sample.token_ids for sample in again]


def test_seeded_request_is_the_same_alone_and_in_a_crowd(services):
    seeded = text_request("The old lighthouse keeper", temperature=1.0, top_p=0.95, seed=99, max_tokens=24)
    alone = services.client.generate(seeded)
    crowd = [text_request(f"Story number {i}:", temperature=1.0, max_tokens=20 + i) for i in range(5)]
    in_crowd = _all(services, [*crowd[:2], seeded, *crowd[2:]])[2]
    assert in_crowd.token_ids == alone.token_ids


def test_logprobs_and_prompt_logprobs_match_hf(services, hf_model, hf_tokenizer):
    prompt_ids = hf_tokenizer("The capital of France is").input_ids
    result = services.client.generate(_tokens_request(prompt_ids, temperature=0.0, max_tokens=5, logprobs=3,
                                                      prompt_logprobs=2))
    assert len(result.logprobs) == 5
    assert_logprobs_match_hf(result, prompt_ids, 3, 2, hf_model, hf_tokenizer)


def test_concurrent_requests_each_get_their_own_logprobs(services, hf_model, hf_tokenizer):
    """Steps pack the logprobs of all their requests, each with its own number of alternatives: every request
    gets back its own, as Hugging Face computes them for it alone."""
    asks = [("The capital of France is", 3, 2), ("Once upon a time", 0, None), ("def add(a, b):", 5, 0),
            ("The quick brown fox", 1, None), ("Water boils at", 2, 4)]
    prompts = [hf_tokenizer(text).input_ids for text, _, _ in asks]
    requests = [_tokens_request(prompt_ids, temperature=0.0, max_tokens=6 + i, logprobs=num_top,
                                **({} if num_prompt_top is None else {"prompt_logprobs": num_prompt_top}))
                for i, (prompt_ids, (_, num_top, num_prompt_top)) in enumerate(zip(prompts, asks))]
    for result, prompt_ids, (_, num_top, num_prompt_top) in zip(_all(services, requests), prompts, asks):
        assert_logprobs_match_hf(result, prompt_ids, num_top, num_prompt_top, hf_model, hf_tokenizer)


def test_greedy_repetition_penalty_and_min_tokens_match_hf(services, hf_model, hf_tokenizer):
    prompt_ids = hf_tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                  add_generation_prompt=True, tokenize=True)
    prompt_ids = list(prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids)
    with torch.inference_mode():
        expected = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False,
                                     repetition_penalty=1.3, min_new_tokens=16)[0, len(prompt_ids):].tolist()
    result = services.client.generate(_tokens_request(prompt_ids, temperature=0.0, max_tokens=24,
                                                      repetition_penalty=1.3, min_tokens=16))
    assert result.token_ids == expected[:len(result.token_ids)]
    assert len(result.token_ids) >= 16


def test_logit_bias_forces_a_token(services, hf_tokenizer):
    forced = hf_tokenizer(" banana").input_ids[-1]
    result = services.client.generate(text_request("I like", temperature=0.0, max_tokens=4,
                                                   logit_bias={forced: 100.0}))
    assert result.token_ids == [forced] * 4


def test_allowed_token_ids_match_hf_with_every_other_token_suppressed(services, hf_model, hf_tokenizer):
    prompt_ids = hf_tokenizer("My three favourite fruits are").input_ids
    allowed = [hf_tokenizer(word).input_ids[-1] for word in (" apples", " pears", ",", " and", " plums")]
    suppressed = sorted(set(range(hf_model.config.vocab_size)) - set(allowed))
    with torch.inference_mode():
        expected = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=8, do_sample=False,
                                     suppress_tokens=suppressed)[0, len(prompt_ids):].tolist()
    result = services.client.generate(_tokens_request(prompt_ids, temperature=0.0, max_tokens=8,
                                                      allowed_token_ids=allowed))
    assert result.token_ids == expected
    assert set(result.token_ids) <= set(allowed)


def test_bad_words_match_hf_no_bad_words(services, hf_model, hf_tokenizer):
    """"Paris" is the greedy answer; banned, alone and after a space, the model must route around it and around "the
    French" (two tokens: "French" is banned only right after "the")."""
    prompt = "The capital of France is"
    words = ["Paris", "the French"]
    sequences = [hf_tokenizer(text, add_special_tokens=False).input_ids for word in words
                 for text in (word, " " + word)]
    assert any(len(sequence) > 1 for sequence in sequences)
    prompt_ids = hf_tokenizer(prompt).input_ids
    with torch.inference_mode():
        expected = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False,
                                     bad_words_ids=sequences)[0, len(prompt_ids):].tolist()
    result = services.client.generate(text_request(prompt, temperature=0.0, max_tokens=24, bad_words=words))
    assert result.token_ids == expected
    assert "Paris" not in result.text and "the French" not in result.text


def test_truncate_prompt_tokens_keeps_the_prompts_tail(services, hf_tokenizer):
    prompt_ids = hf_tokenizer("Once upon a time, in a land far away, there lived a fox who").input_ids
    truncated = services.client.generate(_tokens_request(prompt_ids, temperature=0.0, max_tokens=6,
                                                         truncate_prompt_tokens=5))
    tail = services.client.generate(_tokens_request(prompt_ids[-5:], temperature=0.0, max_tokens=6))
    assert truncated.usage["prompt_tokens"] == 5
    assert truncated.token_ids == tail.token_ids
