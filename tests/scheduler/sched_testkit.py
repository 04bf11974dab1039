"""Test harness for the scheduler: a fake worker that keeps a token-level model of the KV cache and checks the
step-plan contract, plus builders for requests and schedulers."""
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.core.logprobs import LogprobRows, Logprobs
from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import Scheduler
from sluice.scheduler.steps_in_flight import StepsInFlight

EOS = 0


def make_request(request_id: str, prompt: list[int] | int, max_tokens: int = 8, *, priority: int = 0,
                 arrival_time: float = 0.0, cache_salt: str | None = None, deadline: float | None = None,
                 **params) -> Request:
    """An int prompt means that many distinct tokens, unique to the request id (no accidental prefix hits)."""
    if isinstance(prompt, int):
        rng = random.Random(request_id)
        prompt = [rng.randrange(1000, 100_000) for _ in range(prompt)]
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params), priority=priority,
                   arrival_time=arrival_time, cache_salt=cache_salt, deadline=deadline)


def cycling_model(context: list[int]) -> int:
    """A deterministic model that mostly repeats a cycle of 12 tokens (so ngram proposals are often right) and
    breaks it at every 7th position (so some are rejected)."""
    return 1 + (context[-1] * 5 + (2 if len(context) % 7 == 0 else 1)) % 12


def make_scheduler(num_blocks: int = 64, attention_window: int = 0, pipeline_parallel_size: int = 1,
                   **config) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=num_blocks, **config), eos_token_ids={EOS},
                     attention_window=attention_window, pipeline_parallel_size=pipeline_parallel_size)


@dataclass
class _WorkerRequest:
    token_ids: list[int]
    block_ids: list[int]
    num_computed_tokens: int
    num_prompt_tokens: int
    prompt_logprobs: bool
    constrained: bool
    num_rejected_unapplied: int = 0  # of the newest verification, until a plan shows the scheduler applied it


@dataclass
class FakeWorker:
    """Plays the worker's side of the StepPlan contract. Its KV cache stores, per block slot, the token whose KV
    was written there, so a prefix hit that hands out wrong blocks, or a write into a shared block, is caught.
    Requests that ask for prompt logprobs get one entry (the predicted prompt token, logprob 0) per prompt position
    a step computes. A constrained request's sample reports, with grammar_error_probability, that its constraint
    cannot go on, as the worker does when no token continues it. With a `model` (the next token of a context) the
    worker samples what it says and accepts proposals as a greedy model does: while each is the model's next token.
    With a `draft_model`, the slots a plan reserves for draft tokens are filled with its greedy continuation. With an
    `attention_window`, only a query's window must hold its context, and every query of a step checks that it does."""

    block_size: int
    attention_window: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    eos_probability: float = 0.0
    grammar_error_probability: float = 0.0
    vocab: int = 50
    model: Callable[[list[int]], int] | None = None
    draft_model: Callable[[list[int]], int] | None = None
    requests: dict[str, _WorkerRequest] = field(default_factory=dict)
    kv: dict[int, list[int | None]] = field(default_factory=dict)
    sampled_log: dict[str, list[int]] = field(default_factory=dict)  # every token sampled, per request id

    def execute(self, plan: StepPlan) -> StepOutcome:
        for request_id in plan.finished_request_ids:
            self.requests.pop(request_id, None)
        for source, destination in plan.block_copies:
            self.kv[destination] = list(self.kv.get(source, [None] * self.block_size))
        new_ids = [new.request_id for new in plan.new_requests]
        cached_ids = [cached.request_id for cached in plan.cached_requests]
        assert not set(new_ids) & set(cached_ids), "a request is both new and cached"
        assert set(new_ids) | set(cached_ids) == set(plan.num_scheduled_tokens)
        for new in plan.new_requests:
            assert new.request_id not in self.requests, f"{new.request_id} sent whole twice"
            for pos in range(self._first_read(new.num_computed_tokens), new.num_computed_tokens):
                assert self._kv_at(new.block_ids, pos) == new.token_ids[pos], "prefix hit returned wrong KV"
            self.requests[new.request_id] = _WorkerRequest(
                list(new.token_ids), list(new.block_ids), new.num_computed_tokens,
                len(new.token_ids) - new.num_output_tokens, new.sampling_params.prompt_logprobs is not None,
                new.sampling_params.constraint is not None)
        for cached in plan.cached_requests:
            state = self.requests[cached.request_id]
            # the scheduler counts a verification's proposals as accepted until it applies the outcome
            assert cached.num_computed_tokens in (state.num_computed_tokens,
                                                  state.num_computed_tokens + state.num_rejected_unapplied)
            if cached.num_computed_tokens == state.num_computed_tokens:
                state.num_rejected_unapplied = 0
            assert cached.num_blocks - len(cached.new_block_ids) <= len(state.block_ids)
            state.block_ids = state.block_ids[:cached.num_blocks - len(cached.new_block_ids)] + cached.new_block_ids
        sampled, accepted = {}, {}
        holders = Counter(block for state in self.requests.values()
                          for block in state.block_ids[self._first_read(state.num_computed_tokens) // self.block_size:])
        prompt_logprobs, grammar_errors = {}, {}
        for request_id, num_tokens in plan.num_scheduled_tokens.items():
            assert num_tokens > 0
            state = self.requests[request_id]
            proposals = plan.spec_token_ids.get(request_id) or self._draft(state.token_ids,
                                                                           plan.num_draft_tokens.get(request_id, 0))
            inputs = state.token_ids + proposals
            predicted = state.token_ids[state.num_computed_tokens + 1:
                                        min(state.num_computed_tokens + num_tokens + 1, state.num_prompt_tokens)]
            if state.prompt_logprobs and predicted:
                prompt_logprobs[request_id] = Logprobs(0, predicted, [0.0] * len(predicted), [1] * len(predicted))
            for pos in range(state.num_computed_tokens, state.num_computed_tokens + num_tokens):
                block = state.block_ids[pos // self.block_size]
                assert holders[block] == 1, f"write into block {block} shared by {holders[block]} requests"
                self.kv.setdefault(block, [None] * self.block_size)[pos % self.block_size] = inputs[pos]
            if self.attention_window:
                for query in range(state.num_computed_tokens, state.num_computed_tokens + num_tokens):
                    for pos in range(self._first_read(query), query + 1):
                        assert self._kv_at(state.block_ids, pos) == inputs[pos], "a window read another's KV"
            state.num_computed_tokens += num_tokens
            assert state.num_computed_tokens <= len(inputs)
            if state.num_computed_tokens == len(inputs):
                accepted[request_id] = self._accepted(state.token_ids, proposals)
                state.token_ids += accepted[request_id]
                if proposals:
                    state.num_rejected_unapplied = len(proposals) - len(accepted[request_id])
                    state.num_computed_tokens -= state.num_rejected_unapplied
                token = self.sample(state.token_ids)
                state.token_ids.append(token)
                sampled[request_id] = token
                self.sampled_log.setdefault(request_id, []).extend([*accepted[request_id], token])
                if state.constrained and self.rng.random() < self.grammar_error_probability:
                    grammar_errors[request_id] = "no token continues it"
        accepted = {request_id: tokens for request_id, tokens in accepted.items() if request_id in plan.num_proposed}
        return StepOutcome(plan.step_id, sampled,
                           prompt_logprobs=LogprobRows.packed(list(prompt_logprobs), list(prompt_logprobs.values())),
                           grammar_errors=grammar_errors, accepted_token_ids=accepted)

    def _draft(self, context: list[int], num_tokens: int) -> list[int]:
        proposals = []
        for _ in range(num_tokens):
            proposals.append(self.draft_model(context + proposals))
        return proposals

    def _accepted(self, context: list[int], proposals: list[int]) -> list[int]:
        taken = []
        for token in proposals:
            if self.model is None or self.model(context + taken) != token:
                break
            taken.append(token)
        return taken

    def sample(self, context: list[int]) -> int:
        if self.model is not None:
            return self.model(context)
        if self.rng.random() < self.eos_probability:
            return EOS
        return self.rng.randrange(1, self.vocab)

    def _first_read(self, query_position: int) -> int:
        """The first position a query at query_position attends to."""
        return max(query_position - self.attention_window + 1, 0) if self.attention_window else 0

    def _kv_at(self, block_ids: list[int], pos: int) -> int | None:
        return self.kv.get(block_ids[pos // self.block_size], [None] * self.block_size)[pos % self.block_size]


def step(scheduler: Scheduler, worker: FakeWorker):
    plan = scheduler.schedule()
    return plan, scheduler.update_from_outcome(plan, worker.execute(plan))


def run_to_completion(scheduler: Scheduler, worker: FakeWorker, max_steps: int = 10_000):
    updates, steps = [], 0
    while scheduler.has_unfinished_requests():
        assert steps < max_steps, "no progress"
        updates += step(scheduler, worker)[1]
        steps += 1
    return updates, steps


def run_ahead(scheduler: Scheduler, worker: FakeWorker, steps_in_flight: int, max_steps: int = 10_000,
              on_plan: Callable[[StepPlan], None] | None = None,
              on_outcome: Callable[[StepPlan, StepOutcome], None] | None = None):
    """run_to_completion with up to steps_in_flight steps planned before the oldest one's outcome is applied, as
    the offline engine plans them (StepsInFlight); the fake worker executes each plan as it is sent. on_plan sees
    each plan as it is made, on_outcome each step once its outcome is applied."""
    def send(plan: StepPlan) -> StepOutcome:
        if on_plan is not None:
            on_plan(plan)
        return worker.execute(plan)

    updates, num_steps, in_flight = [], 0, StepsInFlight(scheduler, send)
    while scheduler.has_unfinished_requests() or in_flight:
        assert num_steps < max_steps, "no progress"
        while scheduler.has_unfinished_requests() and in_flight.send_next(steps_in_flight):
            pass
        plan, outcome = in_flight.oldest
        updates += in_flight.apply_oldest(outcome)
        if on_outcome is not None:
            on_outcome(plan, outcome)
        num_steps += 1
    return updates, num_steps
