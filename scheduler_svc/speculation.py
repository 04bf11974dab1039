"""Speculative decoding in the scheduler: which requests get proposals, how many tokens, and the acceptance counts.

Method "ngram" proposes tokens here; method "draft" only reserves the slots, which the worker's draft model fills at
the start of the step. A request with proposals in a step still in flight is not planned again until that step's
outcome is applied: how many of its proposals the worker accepts decides where its next tokens go (the same holds
for the draft method, whose next step starts where the accepted tokens end). Requests that cannot speculate keep
the asynchronous schedule (their next step is planned while the last one runs)."""
from dataclasses import dataclass, field

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.ngram_proposer import NgramProposer
from scheduler_svc.request import Request


@dataclass(slots=True)
class SpecDecodeStats:
    num_drafts: int = 0  # request-steps with proposals
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_per_position: list[int] = field(default_factory=list)  # index 0: the first proposed token

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            self.num_accepted_per_position[position] += 1


class Speculation:
    def __init__(self, config: SchedulerConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.proposer = NgramProposer(config.ngram_min, config.ngram_max) \
            if config.speculative_method == "ngram" else None
        self.stats = SpecDecodeStats(num_accepted_per_position=[0] * config.num_speculative_tokens)

    @staticmethod
    def applies_to(request: Request) -> bool:
        """Proposals are verified with the request's sampling as it stands before the step, so requests whose
        next-token distribution moves with each token (penalties, bad words, min_tokens still ahead, structured
        output) or that want logprobs get none."""
        params = request.sampling_params
        return (params.constraint is None and not params.has_penalties and not params.bad_words_token_ids
                and params.logprobs is None and request.num_output_tokens >= params.min_tokens)

    def holds_back(self, request: Request) -> bool:
        """Whether the request waits for its step in flight, so that its next step can carry proposals."""
        return request.num_output_placeholders > 0 and self.applies_to(request)

    def propose(self, request: Request, token_budget: int) -> tuple[int, list[int]]:
        """(how many tokens to propose, ngram's proposals: none for the draft method, whose worker makes them) for a
        request whose next step computes its newest token; never past max_tokens, counting the token the step
        samples after them (admission keeps prompt + max_tokens within the model length)."""
        if request.num_tokens_to_compute != 1 or request.num_output_placeholders or not self.applies_to(request):
            return 0, []
        max_num_tokens = min(self.num_speculative_tokens, token_budget - 1,
                             request.sampling_params.max_tokens - request.num_output_tokens - 1)
        if max_num_tokens <= 0:
            return 0, []
        if self.proposer is None:
            return max_num_tokens, []
        proposals = self.proposer.propose(request, max_num_tokens)
        return len(proposals), proposals

    def forget(self, request_id: str) -> None:
        if self.proposer is not None:
            self.proposer.forget(request_id)
