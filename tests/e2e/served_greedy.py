"""The served greedy check of a model through the real services: token-identical to a reference (Hugging Face, or
the worker's engine in process) alone, as samples forked over a KV pool too small for them (preemption), and under 8
requests at once with prefix-cache hits; its logprobs."""
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from sluice.v1 import generation_pb2 as pb
from tests.worker.stepping import run_greedy

MAX_NEW_TOKENS = 12
SMALL_POOL = ["--num-blocks", "6", "--block-size", "16"]  # fewer than 8 requests of 2 or 3 blocks need
SAMPLES_OVER_THE_POOL, FORKED_TOKENS = 4, 24  # forked together, each growing into a third block: 9 blocks
NUM_TOP = 3


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
