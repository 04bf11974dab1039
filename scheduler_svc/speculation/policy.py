"""Speculative decoding in the scheduler: which requests get proposals, how many tokens, and the acceptance counts.

Method "ngram" proposes tokens here; method "draft" only reserves the slots, which the worker's draft model fills at
the start of the step. A request whose proposals a step in flight verifies waits for that step's outcome, which says
where its next tokens go, while the others keep the asynchronous schedule (the next step is planned while the last
one runs); ngram may propose for them too, after guesses of the tokens that their steps in flight sample. Waiting
leaves the device idle when nothing else would run: then a request whose last verification accepted nothing, and
whose verification step only decodes, gets its next decode anyway, in a step that only decodes, and keeps getting them
in such steps until the outcome (a request whose proposals are being accepted waits: its next proposals, made from the
real tokens, are worth the round trip). Its proposals count as accepted until then, so that decode takes the slot
after the last of them, and the worker moves it to the real position on the device (it continues the verification's
decode rows); the outcome gives the rejected ones' slots back. A request that the draft model serves waits for its
step in flight, as the draft needs its newest token.
A step carries proposals only while its rows (one per request, one per proposed token) stay within max_num_seqs, so
a decode step with proposals still replays a captured graph."""
from dataclasses import dataclass, field

from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.request import Request
from sluice.scheduler.speculation.ngram_proposer import NgramProposer


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


MAX_SKIPS = 63  # the most chances to propose a request lets pass after proposals of which none was accepted


@dataclass(slots=True)
class _Misses:
    count: int = 0  # verifications in a row that accepted nothing
    skips_left: int = 0


class Speculation:
    def __init__(self, config: SchedulerConfig):
        self.num_speculative_tokens = config.num_speculative_tokens
        self.proposer = NgramProposer(config.ngram_min, config.ngram_max) \
            if config.speculative_method == "ngram" else None
        self.stats = SpecDecodeStats(num_accepted_per_position=[0] * config.num_speculative_tokens)
        self._verifying: dict[str, bool] = {}  # requests with proposals in flight -> whether a decode may follow
        self._following: set[str] = set()  # verifying requests with decodes planned after their proposals
        self._misses: dict[str, _Misses] = {}

    def applies_to(self, request: Request) -> bool:
        """Proposals are verified with the request's sampling as it stands before the step, so requests whose
        next-token distribution moves with each token in ways the rows do not follow (bad words, min_tokens still
        ahead) get none. The worker masks each row as a structured-output request's grammar stands after the
        proposals before it, and counts those proposals in its penalties; logprobs come for every row a request
        takes. The draft model samples without the penalties of its own proposals, so requests with penalties get
        ngram's proposals only."""
        params = request.sampling_params
        return (not params.bad_words_token_ids and request.num_output_tokens >= params.min_tokens
                and not (params.has_penalties and self.proposer is None))

    def holds_back(self, request: Request) -> bool:
        """Whether the request waits for its step in flight: one that verifies its proposals, or any for the draft
        model, which needs the newest token of a request it drafts for."""
        return request.request_id in self._verifying or (
            self.proposer is None and request.num_output_placeholders > 0 and self.applies_to(request))

    def may_follow(self, request: Request) -> bool:
        """Whether a request held back by its verification may decode before the outcome: the step only decodes, and
        the request's verification before it accepted nothing."""
        return self._verifying.get(request.request_id, False)

    def is_following(self, request: Request) -> bool:
        return request.request_id in self._following

    def followed(self, request_id: str) -> None:
        self._following.add(request_id)

    def propose(self, request: Request, token_budget: int, max_num_tokens: int) -> tuple[int, list[int]]:
        """(how many tokens to propose, ngram's proposals: none for the draft method, whose worker makes them): at most
        max_num_tokens for a request whose next step computes its newest token; never past max_tokens, counting the
        token the step samples after them (admission keeps prompt + max_tokens within the model length). While steps
        in flight sample the request's newest tokens, ngram's first guesses stand for those and the rest are proposed
        after them: proposals are verified against the real tokens whatever made them, so a wrong guess costs only
        their rejection."""
        placeholders = request.num_output_placeholders
        max_num_tokens = min(self.num_speculative_tokens, max_num_tokens, token_budget - 1,
                             request.sampling_params.max_tokens - request.num_output_tokens - placeholders - 1)
        if max_num_tokens <= 0 or request.num_tokens_to_compute != 1 or not self.applies_to(request) \
                or request.request_id in self._verifying or (self.proposer is None and placeholders) \
                or self._skips(request.request_id):
            return 0, []
        if self.proposer is None:
            return max_num_tokens, []
        # each placeholder (the step's input token among them) is guessed: the proposals follow the last
        proposals = self.proposer.propose(request, placeholders + max_num_tokens)[placeholders:]
        return len(proposals), proposals

    def launched(self, request_id: str, decodes_only: bool) -> None:
        self._verifying[request_id] = decodes_only and request_id in self._misses

    def verified(self, request_id: str, num_proposed: int, num_accepted: int) -> None:
        """A step's proposals for the request came back. After verifications in a row that accept nothing, the
        request lets 1, 3, 7, ... (at most MAX_SKIPS) chances to propose pass: a verification costs rows, and often a
        step's wait."""
        self._verifying.pop(request_id, None)
        self._following.discard(request_id)
        self.stats.record(num_proposed, num_accepted)
        if num_accepted:
            self._misses.pop(request_id, None)
            return
        misses = self._misses.setdefault(request_id, _Misses())
        misses.count += 1
        misses.skips_left = min(2 ** misses.count - 1, MAX_SKIPS)

    def dropped(self, request_id: str) -> None:
        """The request's steps in flight no longer count (it was preempted)."""
        self._verifying.pop(request_id, None)
        self._following.discard(request_id)

    def forget(self, request_id: str) -> None:
        self._verifying.pop(request_id, None)
        self._following.discard(request_id)
        self._misses.pop(request_id, None)
        if self.proposer is not None:
            self.proposer.forget(request_id)

    def _skips(self, request_id: str) -> bool:
        misses = self._misses.get(request_id)
        if misses is None or not misses.skips_left:
            return False
        misses.skips_left -= 1
        return True
