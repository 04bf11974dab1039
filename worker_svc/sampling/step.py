import random
from dataclasses import dataclass, field

import torch

from sluice.core.logprobs import Logprobs
from sluice.core.step_plan import StepPlan
from worker_svc.sampling.ops import sample as sample_tokens
from worker_svc.sampling.rows import SamplingRows
from worker_svc.sampling.speculative import ProposalRows, verify_rows
from worker_svc.sampling.structured_output import GrammarMatchers
from worker_svc.sampling.token_logprobs import token_logprobs


@dataclass(slots=True)
class DeviceSample:
    """A step's sampled tokens, still on the device, and what their logprobs need."""

    request_ids: list[str]
    token_ids: torch.Tensor  # [len(request_ids)] int64
    logprob_logits: torch.Tensor | None = None  # raw logits of the rows that asked for logprobs
    logprob_rows: list[int] = field(default_factory=list)
    logprob_groups: list[tuple[str, int, int]] = field(default_factory=list)
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)  # the proposals the step verified
    num_accepted: torch.Tensor | None = None  # [len(request_ids)] int64, with proposals: how many each accepted


@dataclass(slots=True)
class SampleResult:
    sampled_token_ids: dict[str, int]
    logprobs: dict[str, Logprobs] = field(default_factory=dict)
    grammar_completed_request_ids: list[str] = field(default_factory=list)
    grammar_errors: dict[str, str] = field(default_factory=dict)
    accepted_token_ids: dict[str, list[int]] = field(default_factory=dict)


class StepSampler:
    """The worker's sampling side: each live request's sampling row and grammar matcher, kept in step with the
    plans; samples a step's batch in one pass and reports logprobs where asked."""

    def __init__(self, rows: SamplingRows, grammars: GrammarMatchers, seed: int = 0):
        self.rows = rows
        self.grammars = grammars
        self._unseeded = random.Random(seed)  # seeds for requests that bring none

    def apply(self, plan: StepPlan) -> None:
        for request_id in plan.finished_request_ids:
            self.rows.remove(request_id)
            self.grammars.remove(request_id)
        for new in plan.new_requests:
            params = new.sampling_params
            num_prompt = len(new.token_ids) - new.num_output_tokens
            prompt_ids, output_ids = new.token_ids[:num_prompt], new.token_ids[num_prompt:]
            seed = params.seed if params.seed is not None else self._unseeded.getrandbits(64)
            self.rows.add(new.request_id, params, seed, prompt_ids, output_ids)
            self.grammars.add(new.request_id, params, output_ids)

    def sample(self, logits: torch.Tensor, request_ids: list[str], rows: torch.Tensor,
               spec_token_ids: dict[str, list[int]] | None = None) -> DeviceSample:
        """Samples the batch without waiting for the device. logits: [len(request_ids), vocab] raw, overwritten;
        rows: the requests' SamplingRows indices, on the device. With proposals (spec_token_ids), a request with k
        of them has k + 1 rows of logits in `logits`, and the step verifies them (speculative.py)."""
        spec = ProposalRows.of(request_ids, spec_token_ids, self.rows.device) if spec_token_ids else None
        row_ids = request_ids if spec is None else spec.row_request_ids
        tensors = self.rows.gather(row_ids, rows if spec is None else rows[spec.row_request])
        groups, logprob_rows = [], []
        for i, request_id in enumerate(request_ids):
            num_top = self.rows.params(request_id).logprobs
            if num_top is not None:
                groups.append((request_id, 1, num_top))
                logprob_rows.append(i)
        raw = logits[logprob_rows if spec is None else [spec.first_rows[i] for i in logprob_rows]] if groups else None
        grammar_allowed = self.grammars.allowed_tokens(row_ids)
        if grammar_allowed is not None:
            tensors.allowed = grammar_allowed if tensors.allowed is None else tensors.allowed & grammar_allowed
        num_accepted = None
        if spec is None:
            token_ids = sample_tokens(logits, tensors)
        else:
            token_ids, num_accepted = verify_rows(logits, tensors, spec)
            self.rows.count_accepted(rows, num_accepted)
        self.rows.record(rows, token_ids)
        return DeviceSample(request_ids, token_ids, raw, logprob_rows, groups, spec_token_ids or {}, num_accepted)

    def finish(self, sample: DeviceSample, token_ids: list[int], num_accepted: list[int] = ()) -> SampleResult:
        """The host side once the sampled tokens (`token_ids`, in sample order) and, with proposals, how many of
        them each request accepted have arrived."""
        completed = self.grammars.advance(sample.request_ids, token_ids)
        result = SampleResult(dict(zip(sample.request_ids, token_ids)), grammar_completed_request_ids=completed,
                              grammar_errors=self.grammars.take_errors())
        proposals = sample.spec_token_ids
        result.accepted_token_ids = {request_id: proposals[request_id][:count]
                                     for request_id, count in zip(sample.request_ids, num_accepted)
                                     if request_id in proposals}
        if sample.logprob_groups:
            result.logprobs = token_logprobs(sample.logprob_logits, sample.token_ids[sample.logprob_rows],
                                             sample.logprob_groups)
        return result

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: list[int],
                        groups: list[tuple[str, int, int]]) -> dict[str, Logprobs]:
        if not groups:
            return {}
        return token_logprobs(logits, torch.tensor(targets, device=logits.device), groups)
