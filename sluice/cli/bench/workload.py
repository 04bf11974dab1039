"""The benchmarks' requests: random prompts and lengths from a seed, as token ids or as text."""
import random
from dataclasses import dataclass, field, replace

from sluice.core.sampling_params import SamplingParams


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True)


@dataclass(slots=True, frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    prompt_text: str = ""  # the same prompt as text, for a front that takes only text (set by as_text)
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


def as_text(requests: list[BenchRequest], tokenizer_json: str) -> list[BenchRequest]:
    """Each prompt decoded to text and its ids replaced by that text's tokens, so a front that takes text and one
    that takes ids compute the same prompt."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_json)
    texts = [tokenizer.decode(request.prompt_token_ids) for request in requests]
    return [replace(request, prompt_token_ids=tokenizer.encode(text, add_special_tokens=False).ids, prompt_text=text)
            for request, text in zip(requests, texts)]
