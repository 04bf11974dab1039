"""The sampler's start-up warm-up: a step of every sampling variant (variants.py), so that every kernel variant a
request can select is compiled before the worker serves. No kernel is compiled apart by the number of rows it
samples, so one step of each variant covers every batch.

It samples random logits on a sampler of its own, so nothing of it stays behind (rows, penalty history, grammar
matchers, seeds), and it runs no collective: every tensor-parallel rank runs the same steps.

The CPU's torch path compiles nothing: there it steps through the draws alone, once each. NOTE: SmolLM2's vocabulary
(49,152) on one CPU thread: every variant's steps take 1.1 s, the draws' 0.08 s; the first step of a draw took up to
213 ms more than its second (top-p over the vocabulary), of any other variant at most 30 ms.
"""
import torch

from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import NewRequest, StepPlan
from sluice.worker.sampling import kernel_path
from sluice.worker.sampling.draft_sampling import draw_proposals
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.speculative import Drafts
from sluice.worker.sampling.step import StepSampler
from sluice.worker.sampling.structured_output import GrammarMatchers
from sluice.worker.sampling.upload import upload
from sluice.worker.sampling.variants import SamplingVariant, draw_variants, sampling_variants

REQUESTS_PER_STEP = 2
_PROMPT = [1, 2, 3]
_PROPOSAL = 4


def warm_up_sampler(vocab_size: int, device: torch.device) -> int:
    """Samples every variant's steps; returns how many steps it took."""
    warm_up = SamplerWarmUp(vocab_size, device)
    compiled = kernel_path.runs_kernels(torch.empty(0, device=device))
    for variant in sampling_variants(vocab_size) if compiled else draw_variants(vocab_size):
        warm_up.step(variant, REQUESTS_PER_STEP)
    return warm_up.num_steps


class SamplerWarmUp:
    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.sampler = StepSampler(SamplingRows(vocab_size, (), device), GrammarMatchers(None, vocab_size, device))
        self._generator = torch.Generator(device).manual_seed(0)
        self.num_steps = 0

    def step(self, variant: SamplingVariant, num_requests: int) -> None:
        """A step of num_requests requests of the variant."""
        params = [variant.params(seed) for seed in range(num_requests)]
        self.sample(params, variant.proposals, variant.logprobs)

    @torch.inference_mode()
    def sample(self, params: list[SamplingParams], proposals: str = "", prompt_logprobs: int | None = None) -> None:
        """One step of requests of these parameters, each with a proposal ("ngram", "draft") or none (""), through
        the sampler's device and host sides, then their prompt logprobs where asked; the requests leave after it."""
        self.num_steps += 1
        request_ids = [f"warm-up-{self.num_steps}-{i}" for i in range(len(params))]
        self.sampler.apply(StepPlan(self.num_steps, new_requests=[
            NewRequest(request_id, _PROMPT, [], 0, request_params)
            for request_id, request_params in zip(request_ids, params)]))
        rows = upload(self.sampler.rows.indices(request_ids), torch.int64, self.device)
        spec_token_ids = {request_id: [_PROPOSAL] for request_id in request_ids} if proposals == "ngram" else None
        drafts = self._drafts(request_ids, rows) if proposals == "draft" else None
        num_rows = len(request_ids) * (2 if proposals else 1)
        sample = self.sampler.sample(self._logits(num_rows), request_ids, rows, spec_token_ids, drafts)
        num_accepted = [] if sample.num_accepted is None else sample.num_accepted.tolist()
        self.sampler.finish(sample, sample.token_ids.tolist(), num_accepted)
        if prompt_logprobs is not None:
            self.sampler.prompt_logprobs(self._logits(len(_PROMPT) - 1), _PROMPT[1:], prompt_logprobs)
        self.sampler.apply(StepPlan(self.num_steps, finished_request_ids=request_ids))

    def _drafts(self, request_ids: list[str], rows: torch.Tensor) -> Drafts:
        """One proposal per request, drawn as a draft model's first pass draws, and again as its later passes do
        (at output positions past the first)."""
        tensors = self.sampler.rows.gather(request_ids, rows)
        token_ids, probs = draw_proposals(self._logits(len(request_ids)), tensors)
        if tensors.draws is not None:
            tensors.draws.output_positions = tensors.draws.output_positions + 1
            draw_proposals(self._logits(len(request_ids)), tensors)
        return Drafts(request_ids, [1] * len(request_ids), token_ids.unsqueeze(1),
                      None if probs is None else probs.unsqueeze(1))

    def _logits(self, num_rows: int) -> torch.Tensor:
        return torch.randn(num_rows, self.vocab_size, generator=self._generator, device=self.device)
