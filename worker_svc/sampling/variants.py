"""The sampling variants a step can select, each its own set of kernels or of compiled kernel variants: what a
worker's warm-up samples once each, so that no request pays for a compile.

The axes are the dispatch's own: how a step draws (greedy, temperature alone, from top-k candidates, over the whole
vocabulary), the filters a drawing row may use, every candidate width that ops.candidate_width gives a top-k small
enough for candidates, every number of alternatives up to MAX_LOGPROBS (a kernel's compile-time constant), and how a
step carries proposals (ngram's, a draft model's). The transforms on the raw logits (penalties, logit bias,
min_tokens, bad words, allowed tokens, which structured-output masks share) are torch operations that compile
nothing; each rides on a greedy step of its own, so their first use is paid at start too."""
from dataclasses import dataclass, field, replace
from itertools import combinations

from sluice.core.logprobs import MAX_LOGPROBS
from sluice.core.sampling_params import SamplingParams
from sluice.worker.sampling.ops import TOP_K_CANDIDATES, candidate_width

FILTERS = ("top_k", "top_p", "min_p")
PROPOSALS = ("", "ngram", "draft")
TRANSFORMS = {  # name -> the parameters that use it
    "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2},
    "logit_bias": {"logit_bias": {1: 2.0}},
    "min_tokens": {"min_tokens": 4, "stop_token_ids": [2]},
    "bad_words": {"bad_words_token_ids": [[1], [3, 4]]},
    "allowed_tokens": {"allowed_token_ids": [1, 2, 3]},
}


@dataclass(frozen=True, slots=True)
class SamplingVariant:
    draw: str = "greedy"  # greedy, temperature (no filter), candidates (of the most likely tokens) or vocabulary
    filters: frozenset[str] = field(default_factory=frozenset)  # of FILTERS; candidates always have top_k
    top_k: int = 0  # candidates: the top_k that picks the width
    logprobs: int | None = None  # alternatives asked for, of the sampled and the prompt tokens
    transform: str = ""  # a name of TRANSFORMS, or none
    proposals: str = ""  # one of PROPOSALS

    def params(self, seed: int) -> SamplingParams:
        """One request's parameters that select this variant."""
        params = SamplingParams(temperature=0.0, logprobs=self.logprobs, prompt_logprobs=self.logprobs,
                                **TRANSFORMS.get(self.transform, {}))
        if self.draw == "greedy":
            return params
        params.temperature, params.seed = 0.8, seed
        if "top_k" in self.filters:
            params.top_k = self.top_k if self.draw == "candidates" else TOP_K_CANDIDATES
        if "top_p" in self.filters:
            params.top_p = 0.9
        if "min_p" in self.filters:
            params.min_p = 0.05
        return params


def draw_variants(vocab_size: int) -> list[SamplingVariant]:
    """A variant of each way to draw, with each set of filters and each candidate width, over vocab_size tokens."""
    draws = [SamplingVariant(), SamplingVariant("temperature")]
    draws += [SamplingVariant("candidates", frozenset({"top_k", *others}), top_k)
              for top_k in _top_k_of_each_width(vocab_size) for others in _subsets(("top_p", "min_p"))]
    return draws + [SamplingVariant("vocabulary", filters) for filters in _subsets(FILTERS) if filters]


def sampling_variants(vocab_size: int) -> list[SamplingVariant]:
    """Every variant a step over a vocabulary of vocab_size can select."""
    draws = draw_variants(vocab_size)
    return [*draws,
            *(replace(variant, proposals=proposals) for proposals in PROPOSALS[1:] for variant in draws),
            *(SamplingVariant(logprobs=num_top) for num_top in range(MAX_LOGPROBS + 1)),
            *(SamplingVariant(transform=transform) for transform in TRANSFORMS)]


def _top_k_of_each_width(vocab_size: int) -> list[int]:
    """The smallest top_k of each candidate width short of the vocabulary (a width of the whole vocabulary draws as
    the vocabulary variants do)."""
    widths = {}
    for top_k in range(1, TOP_K_CANDIDATES // 2 + 1):
        widths.setdefault(candidate_width(top_k, vocab_size), top_k)
    return [top_k for width, top_k in widths.items() if width < vocab_size]


def _subsets(names: tuple[str, ...]) -> list[frozenset[str]]:
    return [frozenset(chosen) for size in range(len(names) + 1) for chosen in combinations(names, size)]
