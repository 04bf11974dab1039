import asyncio
import logging
import time

from scheduler_svc.request import FinishReason, Request
from scheduler_svc.router_sessions import Outbox, RouterSessions
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.worker_client import WorkerClient

log = logging.getLogger("sluice.scheduler")
_IDLE_TICK_SECONDS = 0.05  # how often an idle loop looks at deadlines


class EngineLoop:
    """The engine step, over and over: plan, execute on the worker, postprocess and fan out to the routers."""

    def __init__(self, scheduler: Scheduler, worker: WorkerClient, sessions: RouterSessions):
        self.scheduler = scheduler
        self.worker = worker
        self.sessions = sessions
        self._wakeup = asyncio.Event()

    def submit(self, request: Request, outbox: Outbox) -> None:
        self.scheduler.add_request(request)
        self.sessions.bind(request.request_id, outbox)
        self._wakeup.set()

    def finish(self, request_id: str, reason: FinishReason) -> None:
        update = self.scheduler.finish_request(request_id, reason)
        if update is not None:
            self.sessions.publish([update])
            self._wakeup.set()

    async def run(self) -> None:
        while True:
            self.sessions.publish(self.scheduler.expire_deadlines(time.monotonic()))
            plan = self.scheduler.schedule()
            if plan.is_empty:
                await self._idle()
                continue
            outcome = await self.worker.execute(plan)
            self.sessions.publish(self.scheduler.update_from_outcome(plan, outcome))

    async def _idle(self) -> None:
        self._wakeup.clear()
        try:
            await asyncio.wait_for(self._wakeup.wait(), _IDLE_TICK_SECONDS)
        except TimeoutError:
            pass
