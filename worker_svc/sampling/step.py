"""StepSampler: a step's rows sampled in one pass on the device, with logprobs where asked."""
import random
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from sluice.core.logprobs import LogprobRows
from sluice.core.step_plan import StepPlan
from sluice.worker.sampling.ops import sample as sample_tokens
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.speculative import Drafts, ProposalRows, preceding_proposals, verify_rows
from sluice.worker.sampling.structured_output import GrammarMatchers
from sluice.worker.sampling.token_logprobs import LogprobTensors, token_logprobs
from sluice.worker.sampling.upload import upload


@dataclass(slots=True)
class DeviceSample:
    """A step's sampled tokens and the logprobs of the rows that asked, still on the device."""

    request_ids: list[str]
    token_ids: torch.Tensor  # [len(request_ids)] int64
    logprobs: LogprobTensors | None = None
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)  # the proposals the step verified
    num_accepted: torch.Tensor | None = None  # [len(request_ids)] int64, with proposals: how many each accepted
    last_accepted_rows: torch.Tensor | None = None  # [len(request_ids)] int64, with proposals: the logits row of
    # each request's last accepted token (its newest token's row where it accepted none)
    drafts: Drafts | None = None  # a draft model's proposals, whose ids reach spec_token_ids once on the host
    arriving: Future | None = None  # on the CPU, at a pipeline stage before the last: done once token_ids is filled


@dataclass(slots=True)
class SampleResult:
    sampled_token_ids: dict[str, int]
    logprobs: LogprobRows = field(default_factory=LogprobRows)
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
               spec_token_ids: dict[str, list[int]] | None = None, drafts: Drafts | None = None) -> DeviceSample:
        """Samples the batch without waiting for the device. logits: [len(request_ids), vocab] raw, left as they are;
        rows: the requests' SamplingRows indices, on the device. With proposals (ngram's spec_token_ids or a draft
        model's drafts), a request with k of them has k + 1 rows of logits in `logits`, and the step verifies them
        (speculative.py)."""
        spec = None
        if spec_token_ids:
            spec = ProposalRows.of(request_ids, spec_token_ids, self.rows.device)
        elif drafts is not None:
            spec = ProposalRows.of_drafts(request_ids, drafts, self.rows.device)
        row_ids = request_ids if spec is None else spec.row_request_ids
        preceding = None if spec is None else preceding_proposals(spec)
        tensors = self.rows.gather(row_ids, rows if spec is None else rows[spec.row_request], preceding)
        grammar_allowed = self._grammar_allowed(row_ids, spec_token_ids, drafts)
        if grammar_allowed is not None:
            tensors.allowed = grammar_allowed if tensors.allowed is None else tensors.allowed & grammar_allowed
        num_accepted = last_accepted_rows = None
        if spec is None:
            token_ids = row_tokens = sample_tokens(logits, tensors)
        else:
            token_ids, num_accepted, row_tokens = verify_rows(logits, tensors, spec)
            last_accepted_rows = spec.first_rows_t + num_accepted
            self.rows.record_accepted(rows, preceding[last_accepted_rows])
        self.rows.record(rows, token_ids)
        logprobs = self._logprobs(logits, request_ids, row_tokens, spec)
        return DeviceSample(request_ids, token_ids, logprobs, spec_token_ids or {}, num_accepted, last_accepted_rows,
                            drafts)

    def finish(self, sample: DeviceSample, token_ids: list[int], num_accepted: list[int] = ()) -> SampleResult:
        """The host side once the sampled tokens (`token_ids`, in sample order) and, with proposals, how many of
        them each request accepted have arrived."""
        proposals = sample.spec_token_ids
        accepted = {request_id: proposals[request_id][:count]
                    for request_id, count in zip(sample.request_ids, num_accepted) if request_id in proposals}
        sampled = dict(zip(sample.request_ids, token_ids))
        completed = self.grammars.advance(sample.request_ids, token_ids, accepted)
        for request_id, count in zip(sample.request_ids, num_accepted):
            self.rows.accepted_on_host(request_id, count)
        for request_id, num_taken in completed.items():  # tokens past a grammar's end are not taken
            taken = [*accepted.get(request_id, ()), sampled[request_id]][:num_taken]
            if request_id in accepted:
                accepted[request_id], sampled[request_id] = taken[:-1], taken[-1]
        result = SampleResult(sampled, grammar_completed_request_ids=list(completed),
                              grammar_errors=self.grammars.take_errors(), accepted_token_ids=accepted)
        if sample.logprobs is not None:
            result.logprobs = sample.logprobs.rows()
        return result

    def _grammar_allowed(self, row_ids: list[str], spec_token_ids: dict[str, list[int]] | None,
                         drafts: Drafts | None) -> torch.Tensor | None:
        """The grammars' masks of the step's rows, each row's after the proposals before it: a draft model's are
        read back from the device for that (a constrained step waits for its drafts)."""
        if not self.grammars.active:
            return None
        if drafts is not None and self.grammars.constrains(drafts.request_ids):
            spec_token_ids = drafts.on_host(drafts.token_ids.flatten().tolist())
        return self.grammars.allowed_tokens(row_ids, spec_token_ids)

    def _logprobs(self, logits: torch.Tensor, request_ids: list[str], row_tokens: torch.Tensor,
                  spec: ProposalRows | None) -> LogprobTensors | None:
        """Of the rows of the requests that asked (with proposals, all k + 1 of a request's rows: its accepted
        proposals' and its sampled token's come first), straight from the logits when those are all the rows, else
        from a copy of them. row_tokens: each row's token."""
        if not self.rows.num_logprob_rows:
            return None
        if spec is None:
            row_spans = [(i, 1) for i in range(len(request_ids))]
        else:
            ends = [*spec.first_rows[1:], len(spec.row_request_ids)]
            row_spans = [(first, end - first) for first, end in zip(spec.first_rows, ends)]
        groups, logit_rows = [], []
        for request_id, (first, num_rows) in zip(request_ids, row_spans):
            num_top = self.rows.params(request_id).logprobs
            if num_top is not None:
                groups.append((request_id, num_rows, num_top))
                logit_rows += range(first, first + num_rows)
        if not groups:
            return None
        num_top = max(num_top for _, _, num_top in groups)
        if len(logit_rows) == logits.shape[0]:
            return token_logprobs(logits, row_tokens, groups, num_top)
        index = upload(logit_rows, torch.int64, logits.device)
        return token_logprobs(logits[index], row_tokens[index], groups, num_top)

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: list[int], num_top: int) -> LogprobTensors | None:
        """The logprobs of the prompt tokens `targets` that the rows of `logits` predict, in no group yet."""
        return token_logprobs(logits, upload(targets, torch.int64, logits.device), [], num_top)

