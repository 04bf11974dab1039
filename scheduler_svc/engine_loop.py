"""The engine loop: plan, execute on the worker, apply the outcome and fan it out to the routers."""
import asyncio
import logging
import time
from functools import partial

from sluice.core.errors import InvalidArgument, Unavailable
from sluice.core.finish_reason import FinishReason
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.scheduler.kv_cache.event_log import KvEventLog
from sluice.scheduler.kv_transfer.pulls import KvPulls
from sluice.scheduler.outputs import RequestUpdate
from sluice.scheduler.pipeline_depth import PipelineDepth
from sluice.scheduler.request import Request
from sluice.scheduler.routers.outbox import Outbox
from sluice.scheduler.routers.sessions import RouterSessions
from sluice.scheduler.scheduler import Scheduler
from sluice.scheduler.steps_in_flight import StepsInFlight
from sluice.scheduler.telemetry.requests import SchedulerTelemetry
from sluice.scheduler.workers.group import WorkerGroup
from sluice.scheduler.workers.step_timeout import step_timeout_seconds

log = logging.getLogger("sluice.scheduler")
_IDLE_TICK_SECONDS = 0.05  # how often an idle loop looks at deadlines


class EngineLoop:
    """The engine step, over and over: plan, execute on the worker, postprocess and fan out to the routers."""

    def __init__(self, scheduler: Scheduler, worker: WorkerGroup, sessions: RouterSessions,
                 telemetry: SchedulerTelemetry, kv_events: KvEventLog):
        self.scheduler = scheduler
        self.worker = worker
        self.sessions = sessions
        self.telemetry = telemetry
        self.kv_events = kv_events
        self.admitting = True  # False while draining: new requests are rejected with UNAVAILABLE
        self._wakeup = asyncio.Event()
        self.kv_pulls = KvPulls(scheduler, worker, telemetry.metrics, self._publish, self._wakeup.set)

    def submit(self, request: Request, outbox: Outbox, trace_context=None) -> None:
        if not self.admitting:
            raise Unavailable("the scheduler is draining")
        if not self.worker.streaming:
            raise Unavailable(f"the scheduler has no worker: waiting for {self.worker.address}")
        pulls = request.kv_transfer is not None and request.kv_transfer.do_remote_prefill
        if pulls:
            self.scheduler.check_request(request)
            if request.request_id in self.kv_pulls or self.scheduler.get_request(request.request_id) is not None:
                raise InvalidArgument("request_id", f"{request.request_id!r} duplicates a live request")
        else:
            self.scheduler.add_request(request)
        self.sessions.bind(request.request_id, outbox, request.sampling_params.n)
        self.telemetry.submitted(request, trace_context or {})
        if pulls:
            self.kv_pulls.start(request)
        self._wakeup.set()

    @property
    def has_unfinished_requests(self) -> bool:
        """Requests that run, wait or pull, and blocks held for decode replicas."""
        return self.scheduler.has_unfinished_requests() or bool(self.kv_pulls) or bool(self.scheduler.kv_leases)

    def release_lease(self, request_id: str) -> bool:
        released = self.scheduler.kv_leases.release(request_id)
        self._wakeup.set()
        return released

    def finish(self, request_id: str, reason: FinishReason, sample_index: int | None = None) -> None:
        if request_id in self.kv_pulls:
            self.kv_pulls.abort(request_id)
            return
        updates = self.scheduler.finish_samples(request_id, reason, sample_index)
        if updates:
            self._publish(updates)
            self._wakeup.set()

    def worker_lost(self, error: Unavailable) -> None:
        """Ends every request with the error and frees their blocks; run() starts again on a reconnected worker."""
        self.kv_pulls.cancel_all()
        self.telemetry.updated(self.scheduler.abort_all())
        self._seal_kv_events()
        self.sessions.fail_all(error)

    async def run(self) -> None:
        """Raises Unavailable when the worker is lost."""
        # Async scheduling (StepsInFlight): step N's outcome is applied and fanned out to the routers while step
        # N + 1 runs. PipelineDepth says whether step N + 2 is queued too; deadlines expire between two plans.
        depth = PipelineDepth(self.scheduler.pipeline_parallel_size)
        steps = StepsInFlight(self.scheduler, partial(self._send, depth))
        self.scheduler.kv_leases.origin.remote_engine_id = self.worker.kv_engine_id
        while True:
            self._publish(self.scheduler.expire_deadlines(time.monotonic()))
            self.scheduler.kv_leases.expire()
            if steps.send_next(depth.limit) and len(steps) < depth.limit:
                continue
            if not steps:
                depth.idled()
                await self._idle()
                continue
            outcome = await self._receive(steps.oldest.plan)
            depth.outcome_received(time.perf_counter())
            self._publish(steps.apply_oldest(outcome))
            self._seal_kv_events()

    async def _receive(self, plan: StepPlan) -> StepOutcome:
        """The step's outcome; Unavailable once it is overdue (a stopped or stuck rank), as for a lost worker."""
        bound = step_timeout_seconds(plan, self.scheduler.config)
        try:
            async with asyncio.timeout(bound):
                return await self.worker.receive()
        except TimeoutError:
            raise Unavailable(f"step {plan.step_id} had no result within {bound:.1f} s") from None

    def _send(self, depth: PipelineDepth, plan: StepPlan) -> None:
        self.telemetry.planned(plan)
        self.worker.send(plan)
        depth.plan_sent(time.perf_counter())

    def _seal_kv_events(self) -> None:
        """The blocks this step cached, and those its plan evicted, as one batch."""
        self.kv_events.seal(self.scheduler.block_manager.take_kv_events())

    def _publish(self, updates: list[RequestUpdate]) -> None:
        self.telemetry.updated(updates)
        self.sessions.publish(updates)

    async def _idle(self) -> None:
        await self.worker.check_streaming()
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), _IDLE_TICK_SECONDS)
        except TimeoutError:
            pass
