"""The served greedy check of a model through the real services: token-identical to a reference (Hugging Face, or
the worker's engine in process) alone, as samples forked over a KV pool too small for them (preemption), and under 8
requests at once with prefix-cache hits; its logprobs; and its structured output, for a tiny model of the serving
tokenizer's vocabulary."""
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import jsonschema
import pytest
import torch

from sluice.client import sampling_params
from sluice.v1 import generation_pb2 as pb
from tests.e2e.hf_reference import hf_constrained_greedy, hf_greedy
from tests.worker.stepping import run_greedy

MAX_NEW_TOKENS = 12
SMALL_POOL = ["--num-blocks", "6", "--block-size", "16"]  # fewer than 8 requests of 2 or 3 blocks need
SAMPLES_OVER_THE_POOL, FORKED_TOKENS = 4, 24  # forked together, each growing into a third block: 9 blocks
NUM_TOP = 3
NGRAM = ["--speculative-method", "ngram", "--num-speculative-tokens", "3", "--ngram-min", "1", "--ngram-max", "3"]
FAMILY_PROMPTS = [[7 + i] * 20 + [i, 2 * i] for i in range(8)]  # a shared first block, then each its own
ONE_WORKER_AND_TP2 = {"one-worker-ngram": (NGRAM, 1), "tp2": ((), 2)}  # scheduler flags, ranks
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,4}$"},  # no escapes: at most 4 characters
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
JSON_MAX_TOKENS = 40  # PERSON_SCHEMA's longest value has 39 characters; after a prompt of QUOTE, Phi-4-mini's 48
SAMPLED_SEEDS = range(3)
QUOTE = "31415926"  # one token a digit: a grammar that spells it allows one token a step
QUOTING_PROMPT = QUOTE * 3  # 24 tokens: past test_phi3_serving's LongRoPE switch (16)
QUOTING_REGEX, QUOTING_MAX_TOKENS = QUOTE + "[a-z]{4}", 16  # the digits, four letters' tokens at most, and EOS


def token_request(prompt_ids: list[int], max_tokens: int = MAX_NEW_TOKENS, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt_ids),
                              sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling))


def assert_matches_alone_and_together(services, greedy: Callable[[list[int], int], list[int]],
                                      prompts: list[list[int]]) -> None:
    """services: started with SMALL_POOL; greedy(prompt, max_new_tokens): the reference's greedy continuation, cut
    after the first EOS; prompts: 8, sharing a first block."""
    expected = [greedy(prompt, MAX_NEW_TOKENS) for prompt in prompts]
    assert services.client.generate(token_request(prompts[0])).token_ids == expected[0]
    samples = services.client.generate_samples(token_request(prompts[0], FORKED_TOKENS, n=SAMPLES_OVER_THE_POOL))
    assert [sample.token_ids for sample in samples] == [greedy(prompts[0], FORKED_TOKENS)] * len(samples)
    assert services.load().num_preemptions > 0
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda prompt: services.client.generate(token_request(prompt)), prompts))
    assert [result.token_ids for result in results] == expected
    load = services.load()
    assert load.prefix_cache_hit_rate > 0 and load.num_free_blocks == load.num_total_blocks


def engine_greedy(engine, eos_token_id: int) -> Callable[[list[int], int], list[int]]:
    """greedy(prompt, max_new_tokens) of the worker's engine in process (the reference of FP8 weights, which cannot
    give Hugging Face's float tokens), cut after the first EOS as the server stops there."""
    def greedy(prompt: list[int], max_new_tokens: int) -> list[int]:
        tokens = run_greedy(engine, [prompt], max_new_tokens, chunk=1000)[0]
        return tokens[:tokens.index(eos_token_id) + 1] if eos_token_id in tokens else tokens
    return greedy


def saved_checkpoint(folder: Path, hf_config: dict, state: dict[str, torch.Tensor]):
    """(folder, transformers' float32 model of it): the config and weights saved as a Hugging Face folder."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    save_file(state, folder / "model.safetensors")
    AutoConfig.for_model(**hf_config).save_pretrained(folder)
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def assert_served_logprobs_match_hf(services, hf, prompt: list[int]) -> None:
    """The served logprobs of the prompt and of the greedy tokens, with their top alternatives, are Hugging Face's
    float32 log-softmax of its logits."""
    result = services.client.generate(token_request(prompt, logprobs=NUM_TOP, prompt_logprobs=NUM_TOP))
    ids = prompt + result.token_ids
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].log_softmax(-1)
    entries = result.prompt_logprobs + result.logprobs
    assert [entry.token_id for entry in entries] == ids[1:]
    for position, entry in enumerate(entries):
        top_values, top_ids = expected[position].topk(NUM_TOP)
        assert entry.logprob == pytest.approx(expected[position, entry.token_id].item(), abs=1e-4)
        assert [token_id for token_id, _, _ in entry.top] == top_ids.tolist()
        assert [value for _, _, value in entry.top] == pytest.approx(top_values.tolist(), abs=1e-4)


def copy_tokenizer(tokenizer_dir: Path, folder: Path) -> Path:
    """The checkpoint folder, given the tokenizer the router reads and the worker's grammars read."""
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


def assert_structured_output_holds(services, hf, hf_tokenizer) -> None:
    """JSON that PERSON_SCHEMA accepts, greedy and sampled; and under QUOTING_REGEX, Hugging Face's greedy tokens
    under the same masks (ngram proposes each next digit from the prompt, and it is taken)."""
    _assert_json_schema_holds(services, hf_tokenizer(QUOTE).input_ids)
    prompt = hf_tokenizer(QUOTING_PROMPT).input_ids
    reference = hf_constrained_greedy(hf, hf_tokenizer, QUOTING_REGEX, prompt, QUOTING_MAX_TOKENS)
    result = services.client.generate(token_request(prompt, QUOTING_MAX_TOKENS, regex=QUOTING_REGEX))
    assert (result.token_ids, result.finish_reason) == (reference, "stop")


def _assert_json_schema_holds(services, prompt: list[int]) -> None:
    schema = json.dumps(PERSON_SCHEMA)
    requests = [pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt),
                                   sampling=sampling_params(json_schema=schema, max_tokens=JSON_MAX_TOKENS,
                                                            temperature=temperature, seed=seed))
                for temperature, seed in [(0.0, 0), *((1.0, seed) for seed in SAMPLED_SEEDS)]]
    with ThreadPoolExecutor(len(requests)) as pool:
        results = list(pool.map(services.client.generate, requests))
    for result in results:
        assert result.finish_reason == "stop", result.text
        jsonschema.validate(json.loads(result.text), PERSON_SCHEMA)


def assert_family_served_like_hf(services, hf, hf_tokenizer, proposing: bool) -> None:
    """A served family's checks: Hugging Face's greedy tokens alone, forked and 8 at once, its logprobs, and its
    structured output; with ngram proposing (proposing), the quote's verifications took proposals."""
    assert_matches_alone_and_together(services, partial(hf_greedy, hf), FAMILY_PROMPTS)
    assert_served_logprobs_match_hf(services, hf, FAMILY_PROMPTS[3])
    assert_structured_output_holds(services, hf, hf_tokenizer)
    if proposing:
        assert services.load().num_accepted_tokens > 0
