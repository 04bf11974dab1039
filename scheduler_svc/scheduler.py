"""The control plane's core object: queues, admission, step planning, preemption and stop checks."""
import bisect
import heapq
import itertools
from dataclasses import dataclass, field

from scheduler_svc.admission import check_queue_room, validate_request
from scheduler_svc.block_manager import BlockManager
from scheduler_svc.config import SchedulerConfig
from scheduler_svc.outputs import LoadSnapshot, RequestUpdate
from scheduler_svc.request import FinishReason, Request, RequestStatus
from scheduler_svc.request_queue import WaitingQueue, policy_key
from scheduler_svc.step_plan import CachedRequest, NewRequest, StepOutcome, StepPlan
from scheduler_svc.stop_check import check_stop
from sluice.errors import InvalidArgument

RUNNING = RequestStatus.RUNNING


@dataclass(slots=True)
class _StepDraft:
    token_budget: int
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # batch order
    running: dict[str, tuple[Request, list[int]]] = field(default_factory=dict)  # id -> (request, new block ids)
    new_requests: list[NewRequest] = field(default_factory=list)
    preempted: bool = False


class Scheduler:
    def __init__(self, config: SchedulerConfig, eos_token_ids: set[int]):
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.block_manager = BlockManager(config.num_blocks, config.block_size, config.enable_prefix_caching)
        self.num_preemptions = 0
        self._requests: dict[str, Request] = {}  # every unfinished request
        self._waiting = WaitingQueue(config.policy)
        self._running: list[Request] = []  # sorted by policy key: the last one is preempted first
        self._running_key = policy_key(config.policy)
        self._deadlines: list[tuple[float, int, Request]] = []
        self._deadline_counter = itertools.count()
        self._worker_dropped_ids: list[str] = []  # finished or preempted since the last plan
        self._next_step_id = 0
        self._in_flight_step_id: int | None = None

    # -- requests in and out

    def add_request(self, request: Request) -> None:
        if request.request_id in self._requests:
            raise InvalidArgument("request_id", f"{request.request_id!r} duplicates a live request")
        validate_request(request, self.config)
        check_queue_room(request, self._waiting, self.config)
        self._requests[request.request_id] = request
        self._waiting.push(request)
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
        # are not taken by new ones.
        if self._in_flight_step_id is not None:
            raise RuntimeError(f"step {self._in_flight_step_id} has not been applied with update_from_outcome")
        draft = _StepDraft(token_budget=self.config.max_num_batched_tokens)
        self._schedule_running(draft)
        if not draft.preempted:
            self._schedule_waiting(draft)
        plan = StepPlan(
            step_id=self._next_step_id,
            new_requests=draft.new_requests,
            cached_requests=[CachedRequest(request_id, new_block_ids, request.num_computed_tokens)
                             for request_id, (request, new_block_ids) in draft.running.items()],
            num_scheduled_tokens=draft.num_scheduled_tokens,
            finished_request_ids=self._worker_dropped_ids,
        )
        self._worker_dropped_ids = []
        self._next_step_id += 1
        if plan.num_scheduled_tokens:
            self._in_flight_step_id = plan.step_id
        return plan

    def update_from_outcome(self, plan: StepPlan, outcome: StepOutcome) -> list[RequestUpdate]:
        if plan.step_id != outcome.step_id:
            raise ValueError(f"outcome of step {outcome.step_id} applied to plan {plan.step_id}")
        if plan.num_scheduled_tokens and plan.step_id != self._in_flight_step_id:
            raise ValueError(f"step {plan.step_id} is not the step in flight ({self._in_flight_step_id})")
        self._in_flight_step_id = None
        updates = []
        sampled = outcome.sampled_token_ids
        for request_id, num_tokens in plan.num_scheduled_tokens.items():
            request = self._requests.get(request_id)
            if request is None or request.status is not RUNNING:
                continue  # finished (aborted, expired) while the step ran
            request.num_computed_tokens += num_tokens
            self.block_manager.cache_full_blocks(request)
            token_id = sampled.get(request_id)
            if token_id is None or request.num_computed_tokens < request.num_tokens:
                continue  # a prefill chunk short of the prompt's end samples nothing
            request.append_output_token(token_id)
            reason = check_stop(request, self.eos_token_ids, self.config.max_model_len)
            if reason is not None:
                self._finish(request, reason)
            updates.append(self._update(request, [token_id]))
        return updates

    # -- load and liveness

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def has_finished_requests(self) -> bool:
        """Whether the next plan must tell the worker about requests it can drop."""
        return bool(self._worker_dropped_ids)

    def get_load(self) -> LoadSnapshot:
        blocks = self.block_manager
        return LoadSnapshot(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_used_blocks=blocks.num_used_blocks,
            num_free_blocks=blocks.num_free_blocks,
            num_total_blocks=blocks.num_total_blocks,
            prefix_cache_hit_rate=blocks.prefix_cache_hit_rate,
            num_preemptions=self.num_preemptions,
        )

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    # -- planning

    def _schedule_running(self, draft: _StepDraft) -> None:
        prefills = []
        for request in list(self._running):  # a copy: preemption shrinks the running list
            if request.num_tokens_to_compute == 1:
                self._schedule_running_request(request, draft)
            else:
                prefills.append(request)
        for request in prefills:
            self._schedule_running_request(request, draft)

    def _schedule_running_request(self, request: Request, draft: _StepDraft) -> None:
        num_new_tokens = min(request.num_tokens_to_compute, draft.token_budget)
        if num_new_tokens <= 0 or request.status is not RUNNING:
            return
        while (new_block_ids := self.block_manager.allocate_slots(request, num_new_tokens)) is None:
            victim = self._running[-1]
            self._preempt(victim, draft)
            if victim is request:
                return
        draft.token_budget -= num_new_tokens
        draft.num_scheduled_tokens[request.request_id] = num_new_tokens
        draft.running[request.request_id] = (request, new_block_ids)

    def _schedule_waiting(self, draft: _StepDraft) -> None:
        blocks = self.block_manager
        while self._waiting and draft.token_budget > 0 and len(self._running) < self.config.max_num_seqs:
            request = self._waiting.peek()
            prefix_hit = blocks.get_computed_blocks(request)
            num_new_tokens = min(request.num_tokens - prefix_hit.num_tokens, draft.token_budget)
            block_ids = blocks.allocate_slots(request, num_new_tokens, prefix_hit)
            if block_ids is None:
                break
            self._waiting.pop()
            if request.num_preemptions == 0:
                request.num_cached_tokens = prefix_hit.num_tokens
            request.num_computed_tokens = prefix_hit.num_tokens
            request.status = RUNNING
            bisect.insort(self._running, request, key=self._running_key)
            draft.token_budget -= num_new_tokens
            draft.num_scheduled_tokens[request.request_id] = num_new_tokens
            draft.new_requests.append(NewRequest(request.request_id, list(request.all_token_ids), block_ids,
                                                 prefix_hit.num_tokens, request.sampling_params))

    def _preempt(self, request: Request, draft: _StepDraft) -> None:
        """Frees a running request's blocks and requeues it for recompute; undoes its place in this step."""
        self._running.remove(request)
        self.block_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.push(request)
        self._worker_dropped_ids.append(request.request_id)
        num_scheduled = draft.num_scheduled_tokens.pop(request.request_id, 0)
        draft.token_budget += num_scheduled
        draft.running.pop(request.request_id, None)
        draft.preempted = True

    def _is_live(self, request: Request) -> bool:
        return self._requests.get(request.request_id) is request

    def _finish(self, request: Request, reason: FinishReason) -> None:
        if request.status is RUNNING:
            self._running.remove(request)
            self._worker_dropped_ids.append(request.request_id)
        else:
            self._waiting.remove(request)
        self.block_manager.free(request)
        request.finish(reason)
        del self._requests[request.request_id]

    @staticmethod
    def _update(request: Request, new_token_ids: list[int]) -> RequestUpdate:
        return RequestUpdate(request.request_id, new_token_ids, request.finish_reason, request.num_prompt_tokens,
                             request.num_cached_tokens, request.num_output_tokens)
