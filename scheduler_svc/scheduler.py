"""The control plane's core object: queues, admission, step planning, preemption and stop checks."""
import bisect
import dataclasses
import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.finish_reason import FinishReason
from sluice.core.images import VisionInfo
from sluice.core.logprobs import Logprobs
from sluice.core.step_plan import CachedRequest, NewRequest, StepOutcome, StepPlan
from sluice.scheduler.admission import check_queue_room, validate_kv_transfer, validate_request
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.images.admission import validate_images
from sluice.scheduler.images.encoder_cache import ChunkImages, EncoderCache
from sluice.scheduler.kv_cache.block_manager import NO_PREFIX_HIT, BlockManager
from sluice.scheduler.kv_transfer.leases import KvLeases
from sluice.scheduler.outputs import LoadSnapshot, RequestUpdate
from sluice.scheduler.parallel_sampling import SampleGroups, split_samples
from sluice.scheduler.request import Request, RequestStatus
from sluice.scheduler.request_queue import WaitingQueue, policy_key
from sluice.scheduler.speculation.policy import SpecDecodeStats, Speculation
from sluice.scheduler.stop_check import check_stop

RUNNING = RequestStatus.RUNNING
MAX_STEPS_IN_FLIGHT = 3  # the step running on the worker and two queued behind it


@dataclass(slots=True)
class _StepDraft:
    token_budget: int
    encoder_budget: int  # image placeholder tokens the step may still encode
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # batch order
    running: dict[str, tuple[Request, list[int]]] = field(default_factory=dict)  # id -> (request, new block ids)
    new_requests: list[NewRequest] = field(default_factory=list)
    forked: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # sample id -> its block copies
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)  # request id -> its ngram proposals
    num_draft_tokens: dict[str, int] = field(default_factory=dict)  # request id -> slots for the draft model's
    proposal_rows: int = 0  # how many more proposed tokens the step may carry
    running_seats: int = 0  # how many more running requests the step may take (a pipeline stage's share of them)
    decodes_only: bool = False  # every request of the step computes one token (and its proposals), none joins
    followers: list[Request] = field(default_factory=list)  # held back by a decode-only verification
    preempted: bool = False


class Scheduler:
    def __init__(self, config: SchedulerConfig, eos_token_ids: set[int], clock: Callable[[], float] = time.monotonic,
                 attention_window: int = 0, vision: VisionInfo | None = None, pipeline_parallel_size: int = 1):
        """attention_window: tokens back from its newest that a query reads in every layer of the model (0: the
        whole context); the blocks before a request's window are freed as it advances. vision: what the model
        expects of images (None: it takes none). pipeline_parallel_size: the worker's stages; above 1, up to that
        many steps are in flight, and a request is in one of them at most (its next step needs the token that the
        last stage samples)."""
        self.config = config
        self.pipeline_parallel_size = pipeline_parallel_size
        self.max_steps_in_flight = max(MAX_STEPS_IN_FLIGHT, pipeline_parallel_size)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching,
                                          attention_window)
        self.encoder_cache = EncoderCache(config.encoder_cache_size)
        self.kv_leases = KvLeases(self.block_manager, config.kv_lease_timeout, clock)
        self.vision = vision
        self.num_preemptions = 0
        self._requests: dict[str, Request] = {}  # every unfinished request (each sample of an n > 1 request)
        self._sample_groups = SampleGroups()
        self._waiting = WaitingQueue(config.policy)
        self._running: list[Request] = []  # sorted by policy key: the last one is preempted first
        self._running_key = policy_key(config.policy)
        self._deadlines: list[tuple[float, int, Request]] = []
        self._deadline_counter = itertools.count()
        self._worker_dropped_ids: list[str] = []  # finished or preempted since the last plan
        self._next_step_id = 0
        self._in_flight: deque[int] = deque()  # ids of the steps sent and not yet applied, oldest first
        self._clock = clock
        self._progressed_at = clock()  # the last step's outcome, or the send that ended a spell with none in flight
        self.speculation = Speculation(config) if config.speculative_method is not None else None

    # -- requests in and out

    def add_request(self, request: Request) -> None:
        """An n > 1 request enters as n samples: sample 0 waits, the others wait to fork its prompt. A prefill leg
        (do_remote_decode) ends at its first token."""
        self.check_request(request)
        check_queue_room(request, self._waiting, self.config)
        if request.kv_transfer is not None and request.kv_transfer.do_remote_decode:
            params = request.sampling_params
            request.sampling_params = dataclasses.replace(params, max_tokens=1, min_tokens=min(params.min_tokens, 1))
        samples = split_samples(request) if request.sampling_params.n > 1 else [request]
        ids = {request.request_id, *(sample.request_id for sample in samples)}
        if request.request_id in self._sample_groups or not ids.isdisjoint(self._requests):
            raise InvalidArgument("request_id", f"{request.request_id!r} duplicates a live request")
        for sample in samples:
            self._requests[sample.request_id] = sample
            self._track_deadline(sample)
        self._waiting.push(samples[0])
        if len(samples) > 1:
            self._sample_groups.add(samples)

    def check_request(self, request: Request) -> None:
        """Raises the error that would refuse the request, but for a full queue."""
        validate_request(request, self.config)
        validate_images(request, self.vision, self.config)
        validate_kv_transfer(request, self.config)

    def _track_deadline(self, request: Request) -> None:
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, next(self._deadline_counter), request))
            if len(self._deadlines) > 2 * len(self._requests) + 64:  # drop the entries of finished requests
                self._deadlines = [entry for entry in self._deadlines if self._is_live(entry[2])]
                heapq.heapify(self._deadlines)

    def abort_request(self, request_id: str) -> RequestUpdate | None:
        return self.finish_request(request_id, FinishReason.ABORT)

    def finish_request(self, request_id: str, reason: FinishReason) -> RequestUpdate | None:
        """Ends a live request at once (abort, or STOP when the router matched a stop string) and frees its
        blocks; the worker hears of it in the next plan. None if the request is unknown or already finished."""
        request = self._requests.get(request_id)
        if request is None:
            return None
        self._finish(request, reason)
        return self._update(request, [])

    def finish_samples(self, request_id: str, reason: FinishReason,
                       sample_index: int | None = None) -> list[RequestUpdate]:
        """finish_request by the client's request id: every sample of it, or the one of `sample_index`."""
        samples = self._sample_groups.unfinished(request_id)
        if not samples and request_id in self._requests:
            samples = [self._requests[request_id]]
        ending = [s for s in samples if sample_index is None or s.sample_index == sample_index]
        updates = []
        for sample in ending:
            self._finish(sample, reason)
            updates.append(self._update(sample, []))
        return updates

    def abort_all(self) -> list[RequestUpdate]:
        """Ends every live request and forgets the steps in flight and the prefix cache: the worker that held their
        KV is gone, and the next plan goes to a worker that starts from nothing."""
        client_request_ids = {request.client_request_id for request in self._requests.values()}
        updates = [update for request_id in client_request_ids
                   for update in self.finish_samples(request_id, FinishReason.ABORT)]
        self.kv_leases.release_all()
        self.block_manager.reset_prefix_cache()
        self.encoder_cache.reset()
        self._worker_dropped_ids = []
        self._in_flight.clear()
        return updates

    def expire_deadlines(self, now: float) -> list[RequestUpdate]:
        updates = []
        while self._deadlines and self._deadlines[0][0] <= now:
            request = heapq.heappop(self._deadlines)[2]
            if self._is_live(request):
                self._finish(request, FinishReason.DEADLINE)
                updates.append(self._update(request, []))
        return updates

    # -- one engine step: schedule() -> worker -> update_from_outcome()

    def schedule(self) -> StepPlan:
        # vLLM v1 style: there is no prefill phase and no decode phase. Every request has num_computed_tokens and
        # num_tokens (prompt + output so far); a step gives scheduled requests some of the difference, within a
        # token budget (max_num_batched_tokens) and max_num_seqs. Running requests go first, decodes (one token)
        # before continuing prefill chunks, each in policy order. Waiting requests then fill the remaining budget
        # in policy order ("priority": lower value first, FCFS within a value; "fcfs": arrival), a long prompt
        # split into chunks across steps; the first waiting request that does not fit stops admission, so no
        # request overtakes one ahead of it. When a running request needs a block and none is free, the last
        # running request in policy order (lowest priority, latest arrival) is preempted: its blocks are freed,
        # it goes back to the front of the waiting queue and is later recomputed (prefix cache permitting) and
        # re-sent whole. A step that preempted admits no waiting request, so blocks freed for running requests
        # are not taken by new ones. Scheduling is asynchronous: a step's tokens count as computed once planned, and
        # a request that will sample holds a placeholder for the token, which the worker feeds into its next step
        # itself; so step N + 1 is planned while step N runs (at most MAX_STEPS_IN_FLIGHT unapplied). Image
        # placeholders are prompt tokens; a chunk stops before an image whose encoder output the worker does not hold
        # when its encoding exceeds the step's encoder budget or the encoder cache's room (vLLM v1's encoder budget).
        # Across P pipeline stages, a request waits for its step's outcome before its next step, and a step takes at
        # most 1/P of the running requests, so that the P steps in flight are alike.
        if len(self._in_flight) >= self.max_steps_in_flight:
            raise RuntimeError(f"steps {list(self._in_flight)} have not been applied with update_from_outcome")
        draft = _StepDraft(token_budget=self.config.max_num_batched_tokens,
                           encoder_budget=self.config.max_num_encoder_input_tokens,
                           proposal_rows=self.config.max_num_seqs - len(self._running))
        self._fork_ready_samples(draft)
        self._schedule_running(draft)
        if not draft.preempted:
            self._schedule_waiting(draft)
        forked = [request for request_id, (request, _) in draft.running.items() if request_id in draft.forked]
        freed_encoder_hashes, encoder_inputs = self.encoder_cache.take_step()
        plan = StepPlan(
            step_id=self._next_step_id,
            new_requests=draft.new_requests + [self._new_request(request, request.num_computed_tokens,
                                                                 self.block_manager.block_ids(request.request_id))
                                               for request in forked],
            cached_requests=[CachedRequest(request_id, new_block_ids, request.num_computed_tokens,
                                           self.block_manager.num_blocks(request_id))
                             for request_id, (request, new_block_ids) in draft.running.items()
                             if request_id not in draft.forked],
            num_scheduled_tokens=draft.num_scheduled_tokens,
            finished_request_ids=self._worker_dropped_ids,
            block_copies=[copy for request in forked for copy in draft.forked[request.request_id]],
            spec_token_ids=draft.spec_token_ids,
            num_draft_tokens=draft.num_draft_tokens,
            freed_encoder_hashes=freed_encoder_hashes,
            encoder_inputs=encoder_inputs,
        )
        self._worker_dropped_ids = []
        self._next_step_id += 1
        if plan.num_scheduled_tokens:
            self._advance(plan)
            if not self._in_flight:
                self._progressed_at = self._clock()
            self._in_flight.append(plan.step_id)
            for request_id in plan.num_proposed:
                self.speculation.launched(request_id, draft.decodes_only)
        return plan

    def _advance(self, plan: StepPlan) -> None:
        num_proposed = plan.num_proposed
        for request_id, num_tokens in plan.num_scheduled_tokens.items():
            request = self._requests[request_id]
            request.num_computed_tokens += num_tokens
            request.last_step = plan.step_id
            proposed = num_proposed.get(request_id, 0)
            if request.num_computed_tokens == request.num_tokens + request.num_output_placeholders + proposed:
                request.num_output_placeholders += 1 + proposed
            if request.images:
                self.encoder_cache.release_passed(request)

    def update_from_outcome(self, plan: StepPlan, outcome: StepOutcome) -> list[RequestUpdate]:
        if plan.step_id != outcome.step_id:
            raise ValueError(f"outcome of step {outcome.step_id} applied to plan {plan.step_id}")
        if not plan.num_scheduled_tokens:
            return []
        if not self._in_flight or plan.step_id != self._in_flight[0]:
            raise ValueError(f"step {plan.step_id} is not the oldest step in flight ({list(self._in_flight)})")
        self._in_flight.popleft()
        self._progressed_at = self._clock()
        updates = self._fail_grammar_errors(plan, outcome.grammar_errors)
        sampled = outcome.sampled_token_ids
        grammar_completed = set(outcome.grammar_completed_request_ids)
        chunk_starts = {r.request_id: r.num_computed_tokens for r in (*plan.new_requests, *plan.cached_requests)}
        num_proposed = plan.num_proposed
        logprobs, step_prompt_logprobs = outcome.logprobs.by_request(), outcome.prompt_logprobs.by_request()
        for request_id in plan.num_scheduled_tokens:
            request = self._requests.get(request_id)
            if request is None or request.status is not RUNNING or request.preempted_at_step > plan.step_id:
                continue  # finished (aborted, expired) or preempted since the step was planned
            prompt_logprobs = self._unsent_prompt_logprobs(request, chunk_starts[request_id],
                                                           step_prompt_logprobs.get(request_id))
            accepted = outcome.accepted_token_ids.get(request_id, [])
            if request_id in num_proposed:
                self._drop_rejected(request, num_proposed[request_id], len(accepted))
            self.block_manager.cache_full_blocks(request)
            token_id = sampled.get(request_id)
            if token_id is None:
                if prompt_logprobs is not None:  # a prefill chunk short of the prompt's end samples nothing
                    updates.append(self._update(request, [], prompt_logprobs=prompt_logprobs))
                continue
            request.num_output_placeholders -= 1 + num_proposed.get(request_id, 0)
            new_token_ids = self._append_until_stop(request, [*accepted, token_id], request_id in grammar_completed)
            token_logprobs = logprobs.get(request_id)
            if token_logprobs is not None:  # with proposals, rows past the first rejected one come too
                token_logprobs = token_logprobs.slice(0, len(new_token_ids))
            updates.append(self._update(request, new_token_ids, token_logprobs, prompt_logprobs))
        return updates

    def _drop_rejected(self, request: Request, num_proposed: int, num_accepted: int) -> None:
        """The KV of rejected proposals is not kept: their slots go back, and so does a block left holding none."""
        self.speculation.verified(request.request_id, num_proposed, num_accepted)
        request.num_computed_tokens -= num_proposed - num_accepted
        self.block_manager.free_past_computed(request)

    def _append_until_stop(self, request: Request, token_ids: list[int], grammar_completed: bool) -> list[int]:
        """Appends the step's tokens up to the first that stops the request (which ends it); returns those taken.
        A request that ends offers the blocks its accepted proposals filled to the prefix cache first."""
        for num_taken, token_id in enumerate(token_ids, 1):
            request.append_output_token(token_id)
            reason = FinishReason.STOP if grammar_completed and num_taken == len(token_ids) \
                else check_stop(request, self.eos_token_ids, self.config.max_model_len)
            if reason is not None:
                if num_taken > 1:
                    self.block_manager.cache_full_blocks(request)
                self._finish(request, reason)
                return token_ids[:num_taken]
        return token_ids

    def _fail_grammar_errors(self, plan: StepPlan, errors: dict[str, str]) -> list[RequestUpdate]:
        """Ends each request whose constraint the worker could not continue with INVALID_ARGUMENT; its token of
        this step, if any, is not taken."""
        updates = []
        for request_id, reason in errors.items():
            request = self._requests.get(request_id)
            if request is None or request.status is not RUNNING or request.preempted_at_step > plan.step_id:
                continue  # finished since, or the error is of a run dropped by a preemption
            self._finish(request, FinishReason.ERROR)
            error = InvalidArgument(f"sampling.{request.sampling_params.constraint}",
                                    f"{reason} (at output token {request.num_output_tokens + 1})")
            updates.append(self._update(request, [], error=error))
        return updates

    @staticmethod
    def _unsent_prompt_logprobs(request: Request, first: int, logprobs: Logprobs | None) -> Logprobs | None:
        """The part of a chunk's prompt logprobs not sent before (a recompute after preemption repeats them). The
        chunk starting at computed token `first` holds the logprobs of prompt tokens first + 1, first + 2, ..."""
        if logprobs is None:
            return None
        num_sent = request.num_prompt_logprobs_sent
        request.num_prompt_logprobs_sent = max(num_sent, first + len(logprobs))
        if num_sent >= first + len(logprobs):
            return None
        return logprobs.slice(max(num_sent - first, 0))

    # -- load and liveness

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_load(self) -> LoadSnapshot:
        blocks = self.block_manager
        spec = self.speculation.stats if self.speculation is not None else SpecDecodeStats()
        return LoadSnapshot(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_used_blocks=blocks.num_used_blocks,
            num_free_blocks=blocks.num_free_blocks,
            num_total_blocks=blocks.num_total_blocks,
            prefix_cache_hit_rate=blocks.prefix_cache_hit_rate,
            num_preemptions=self.num_preemptions,
            engine_silence=self._clock() - self._progressed_at if self._in_flight else None,
            num_prefill_pending_tokens=self._waiting.num_tokens + sum(
                request.num_prompt_tokens - request.num_cached_tokens for request in self._running
                if not request.output_token_ids),
            num_drafts=spec.num_drafts,
            num_draft_tokens=spec.num_draft_tokens,
            num_accepted_tokens=spec.num_accepted_tokens,
            num_accepted_tokens_per_position=list(spec.num_accepted_per_position),
        )

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    # -- planning

    def _schedule_running(self, draft: _StepDraft) -> None:
        draft.running_seats = math.ceil(len(self._running) / self.pipeline_parallel_size)
        decodes, prefills = [], []
        for request in self._running:
            (prefills if request.num_tokens_to_compute > 1 else decodes).append(request)
        draft.decodes_only = not prefills and not self._waiting and not draft.forked
        for request in decodes + prefills:
            self._schedule_running_request(request, draft)
        if draft.decodes_only and not draft.num_scheduled_tokens:  # rather than leave the device idle
            for request in draft.followers:
                self._schedule_running_request(request, draft, follows=True)
                if request.request_id in draft.num_scheduled_tokens:
                    self.speculation.followed(request.request_id)

    def _schedule_running_request(self, request: Request, draft: _StepDraft, follows: bool = False) -> None:
        num_new_tokens = min(request.num_tokens_to_compute - self._sample_groups.num_held_back(request),
                             draft.token_budget)
        if num_new_tokens <= 0 or request.status is not RUNNING or self._reaches_its_length(request):
            return
        if self.pipeline_parallel_size > 1 and self._in_flight and request.last_step >= self._in_flight[0]:
            return
        if draft.running_seats <= 0 and request.request_id not in draft.forked:  # a fork runs in its own step
            return
        speculation = self.speculation
        if speculation is not None and not follows and speculation.holds_back(request):
            if not (draft.decodes_only and speculation.may_follow(request)):
                return
            if not speculation.is_following(request):
                draft.followers.append(request)
                return
        images = self._chunk_images(request, request.num_computed_tokens, num_new_tokens, draft)
        if images is not None:
            num_new_tokens = images.num_tokens
            if num_new_tokens == 0:
                return
        num_proposed, proposals = (0, []) if speculation is None \
            else speculation.propose(request, draft.token_budget, draft.proposal_rows)
        while (new_block_ids := self.block_manager.allocate_slots(request, num_new_tokens + num_proposed)) is None:
            if num_proposed:  # no room for the proposals: the request decodes without them rather than preempt
                num_proposed, proposals = 0, []
                continue
            victim = self._running[-1]
            self._preempt(victim, draft)
            if victim is request:
                return
        num_new_tokens += num_proposed
        draft.running_seats -= 1
        self._take_images(request, images, draft)
        draft.token_budget -= num_new_tokens
        draft.num_scheduled_tokens[request.request_id] = num_new_tokens
        draft.running[request.request_id] = (request, new_block_ids)
        draft.proposal_rows -= num_proposed
        if proposals:
            draft.spec_token_ids[request.request_id] = proposals
        elif num_proposed:
            draft.num_draft_tokens[request.request_id] = num_proposed

    def _schedule_waiting(self, draft: _StepDraft) -> None:
        blocks = self.block_manager
        while self._waiting and draft.token_budget > 0 and len(self._running) < self.config.max_num_seqs:
            request = self._waiting.peek()
            held_back = self._sample_groups.num_held_back(request)
            prefix_hit = NO_PREFIX_HIT if request.sampling_params.prompt_logprobs is not None \
                else blocks.get_computed_blocks(request, 1 + held_back)
            num_new_tokens = min(request.num_tokens - prefix_hit.num_tokens - held_back, draft.token_budget)
            images = self._chunk_images(request, prefix_hit.num_tokens, num_new_tokens, draft)
            if images is not None:
                num_new_tokens = images.num_tokens
                if num_new_tokens == 0:
                    break
            block_ids = blocks.allocate_slots(request, num_new_tokens, prefix_hit)
            if block_ids is None:
                break
            self._take_images(request, images, draft)
            self._waiting.pop()
            if request.num_preemptions == 0:
                request.num_cached_tokens = prefix_hit.num_tokens
            request.num_computed_tokens = prefix_hit.num_tokens
            request.status = RUNNING
            bisect.insort(self._running, request, key=self._running_key)
            draft.token_budget -= num_new_tokens
            draft.num_scheduled_tokens[request.request_id] = num_new_tokens
            draft.new_requests.append(self._new_request(request, prefix_hit.num_tokens, block_ids))

    def _chunk_images(self, request: Request, start: int, num_tokens: int, draft: _StepDraft) -> ChunkImages | None:
        """The images of the request's chunk, which may cut it short; None for a chunk after the last image."""
        if not request.images or start >= request.images[-1].end:
            return None
        return self.encoder_cache.plan_chunk(request, start, num_tokens, draft.encoder_budget)

    def _take_images(self, request: Request, images: ChunkImages | None, draft: _StepDraft) -> None:
        if images is not None:
            self.encoder_cache.take(request.request_id, images)
            draft.encoder_budget -= images.num_encoder_tokens

    def _fork_ready_samples(self, draft: _StepDraft) -> None:
        for parent, children in self._sample_groups.take_ready():
            for child in children:
                self._fork(parent, child, draft)

    def _fork(self, parent: Request, child: Request, draft: _StepDraft) -> None:
        """The child takes the parent's prompt KV short of the last token; without a free block for the copy or a
        free seat it waits and prefills on its own (prefix cache permitting)."""
        fork = None
        if len(self._running) < self.config.max_num_seqs:
            fork = self.block_manager.fork(parent.request_id, child.request_id, parent.num_prompt_tokens - 1)
        if fork is None:
            self._waiting.push(child)
            return
        child.num_computed_tokens = parent.num_prompt_tokens - 1
        child.num_cached_tokens = parent.num_cached_tokens
        child.status = RUNNING
        bisect.insort(self._running, child, key=self._running_key)
        draft.forked[child.request_id] = fork.copies

    def _reaches_its_length(self, request: Request) -> bool:
        """Whether the tokens in flight already take the request to max_tokens or the model length."""
        num_in_flight = request.num_output_placeholders
        return num_in_flight > 0 and (
            request.num_output_tokens + num_in_flight >= request.sampling_params.max_tokens
            or request.num_tokens + num_in_flight >= self.config.max_model_len)

    @staticmethod
    def _new_request(request: Request, num_computed_tokens: int, block_ids: list[int]) -> NewRequest:
        return NewRequest(request.request_id, list(request.all_token_ids), block_ids, num_computed_tokens,
                          request.sampling_params, request.num_output_tokens,
                          images=[image.without_pixels() for image in request.images])

    def _preempt(self, request: Request, draft: _StepDraft) -> None:
        """Frees a running request's blocks and requeues it for recompute; undoes its place in this step."""
        self._running.remove(request)
        self.block_manager.free(request)
        self.encoder_cache.release(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_output_placeholders = 0
        request.preempted_at_step = self._next_step_id
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.push(request)
        self._worker_dropped_ids.append(request.request_id)
        num_scheduled = draft.num_scheduled_tokens.pop(request.request_id, 0)
        draft.token_budget += num_scheduled
        draft.running.pop(request.request_id, None)
        draft.spec_token_ids.pop(request.request_id, None)
        draft.num_draft_tokens.pop(request.request_id, None)
        if self.speculation is not None:
            self.speculation.dropped(request.request_id)
        draft.preempted = True

    def _is_live(self, request: Request) -> bool:
        return self._requests.get(request.request_id) is request

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RUNNING:
            self._running.remove(request)
            self._worker_dropped_ids.append(request.request_id)
        else:
            self._waiting.remove(request)
        if reason is FinishReason.LENGTH and request.kv_transfer is not None and request.kv_transfer.do_remote_decode:
            request.kv_lease = self.kv_leases.hold(request)
        self.block_manager.free(request)
        self.encoder_cache.release(request.request_id)
        request.finish(reason)
        del self._requests[request.request_id]
        if self.speculation is not None:
            self.speculation.forget(request.request_id)
        for orphan in self._sample_groups.forget(request):
            self._waiting.push(orphan)

    @staticmethod
    def _update(request: Request, new_token_ids: list[int], logprobs: Logprobs | None = None,
                prompt_logprobs: Logprobs | None = None, error: SluiceError | None = None) -> RequestUpdate:
        return RequestUpdate(request.client_request_id, new_token_ids, request.finish_reason,
                             request.num_prompt_tokens, request.num_cached_tokens, request.num_output_tokens,
                             request.sample_index, logprobs, prompt_logprobs, error, request.kv_lease)
