"""The benchmarks' requests: random prompts and lengths from a seed, as token ids or as text, and as a JSON file that
another engine can read too."""
import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from sluice.core.sampling_params import SamplingParams


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True)


@dataclass(slots=True, frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    prompt_text: str = ""  # the same prompt as text, for a front that takes only text (set by as_text, with_images)
    images: tuple[bytes, ...] = ()  # encoded images, sent before prompt_text in one chat message (with_images)
    sampling: SamplingParams = field(default_factory=_greedy)  # every control but max_tokens

    def sampling_params(self) -> SamplingParams:
        return replace(self.sampling, max_tokens=self.max_tokens)


def random_workload(num_requests: int, input_lens: tuple[int, int], output_lens: tuple[int, int], vocab_size: int,
                    seed: int = 0) -> list[BenchRequest]:
    """Random-token prompts with lengths uniform in the given inclusive ranges (the vLLM-class standard workload)."""
    rng = random.Random(seed)
    return [
        BenchRequest([rng.randrange(vocab_size) for _ in range(rng.randint(*input_lens))], rng.randint(*output_lens))
        for _ in range(num_requests)
    ]


def nano_vllm_workload(num_requests: int, input_lens: tuple[int, int], output_lens: tuple[int, int],
                       seed: int = 0) -> list[BenchRequest]:
    """nano-vllm's bench.py requests, drawn as it draws them: token ids in [0, 10000], every prompt before the first
    output length."""
    rng = random.Random(seed)
    prompts = [[rng.randint(0, 10000) for _ in range(rng.randint(*input_lens))] for _ in range(num_requests)]
    return [BenchRequest(prompt, rng.randint(*output_lens)) for prompt in prompts]


def write_workload(path: Path, requests: list[BenchRequest]) -> None:
    """{"requests": [{"prompt_token_ids": [...], "max_tokens": N}, ...]}; sampling controls stay out (flags of each
    engine that reads it)."""
    path.write_text(json.dumps({"requests": [{"prompt_token_ids": r.prompt_token_ids, "max_tokens": r.max_tokens}
                                             for r in requests]}))


def read_workload(path: Path) -> list[BenchRequest]:
    return [BenchRequest(list(r["prompt_token_ids"]), int(r["max_tokens"]))
            for r in json.loads(path.read_text())["requests"]]


def length_ranges(requests: list[BenchRequest]) -> tuple[list[int], list[int]]:
    """The smallest and largest prompt length, and the same of max_tokens."""
    inputs, outputs = [len(r.prompt_token_ids) for r in requests], [r.max_tokens for r in requests]
    return [min(inputs), max(inputs)], [min(outputs), max(outputs)]


def as_text(requests: list[BenchRequest], tokenizer_json: str) -> list[BenchRequest]:
    """Each prompt decoded to text and its ids replaced by that text's tokens, so a front that takes text and one
    that takes ids compute the same prompt."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    texts = [tokenizer.decode(request.prompt_token_ids) for request in requests]
    return [replace(request, prompt_token_ids=tokenizer.encode(text, add_special_tokens=False).ids, prompt_text=text)
            for request, text in zip(requests, texts)]
