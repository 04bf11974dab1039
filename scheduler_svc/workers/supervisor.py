"""Runs the engine loop on the worker group, and resumes it once a lost worker serves again."""
import asyncio
import logging
from collections.abc import Awaitable, Callable

from sluice.core.errors import Unavailable
from sluice.scheduler.engine_loop import EngineLoop
from sluice.scheduler.workers.group import WorkerGroup

log = logging.getLogger("sluice.scheduler")
_RETRY_SECONDS = 1.0  # after a worker that served failed to set up again


class WorkerSupervisor:
    """Runs the engine loop on a started worker group, and outlives its workers.

    When any rank of the group is lost (its stream ends, or a step's result is overdue: a stopped or stuck rank),
    every rank's stream is cancelled, every request ends with UNAVAILABLE (none runs twice: the client decides
    whether to retry) and `on_connected` hears False; the supervisor waits for every rank to serve again, checks
    that each serves what it did, sets up their KV caches as before, resumes, and `on_connected` hears True. No
    failure of a worker ends the supervisor: a set-up that fails is tried again.
    """

    def __init__(self, loop: EngineLoop, worker: WorkerGroup, on_connected: Callable[[bool], Awaitable[None]]):
        self.loop = loop
        self.worker = worker
        self.on_connected = on_connected

    async def run(self) -> None:
        while True:
            try:
                await self.loop.run()
            except Unavailable as error:
                log.error("lost the worker: %s", error)
                self.worker.abandon()
                self.loop.worker_lost(Unavailable(f"the scheduler lost its worker: {error}"))
            await self.on_connected(False)
            await self._reconnect()
            log.info("worker %s is back: serving again", self.worker.address)
            await self.on_connected(True)

    async def _reconnect(self) -> None:
        while True:
            try:
                await self.worker.restart()
                return
            except Exception as error:
                log.warning("setting up the worker again failed: %s", error)
                self.worker.abandon()
                await asyncio.sleep(_RETRY_SECONDS)
