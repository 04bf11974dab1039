import random
from dataclasses import dataclass, field, replace

from sluice.core.sampling_params import SamplingParams


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True)


@dataclass(slots=True, frozen=True)
class BenchRequest:
    prompt_token_ids: list[int]
    max_tokens: int
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
