from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.v1 import generation_pb2 as pb

MAX_NEW_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "List three colors of the rainbow:",
    "The chemical formula of water is",
    "Translate to French: I like apples.",
    "import numpy as np\nx = np.arange(10)\n",
    "In 1969, the first human to walk on the moon was",
    "Write a haiku about the sea.",
]


def _request(prompt_ids: list[int]) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids),
                              sampling=pb.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0))


@pytest.fixture(scope="module")
def references(hf_greedy_of, hf_tokenizer):
    prompts = [hf_tokenizer(p).input_ids for p in PROMPTS]
    return [(ids, hf_greedy_of(ids, MAX_NEW_TOKENS)) for ids in prompts]


def _assert_same(expected: list[int], got) -> None:
    assert got.token_ids == expected
    assert got.finish_reason == ("stop" if len(expected) < MAX_NEW_TOKENS else "length")


def test_one_at_a_time(services, references):
    for prompt_ids, expected in references:
        _assert_same(expected, services.client.generate(_request(prompt_ids)))


def test_all_at_once(services, references):
    with ThreadPoolExecutor(len(references)) as pool:
        results = list(pool.map(lambda ref: services.client.generate(_request(ref[0])), references))
    for (_, expected), got in zip(references, results):
        _assert_same(expected, got)


def test_chat_capital_of_france(services):
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="What is the capital of France?")])
    result = services.client.generate(pb.GenerateRequest(chat=chat, sampling=pb.SamplingParams(temperature=0.0)))
    assert result.text == "The capital of France is Paris."
    assert result.finish_reason == "stop"
    assert 0 < result.time_to_first_token_seconds < 60
