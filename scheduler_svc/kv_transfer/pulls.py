"""A decode replica's decode legs on their way in: each pulls the prompt blocks its prefix cache lacks from the
prefill replica, then waits to run like any request, finding them as prefix-cache hits."""
import asyncio
import logging
import time
from collections.abc import Callable

from sluice.core.errors import SluiceError
from sluice.core.finish_reason import FinishReason
from sluice.scheduler.kv_transfer.prefill_links import PrefillLinks
from sluice.scheduler.outputs import RequestUpdate
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import Scheduler
from sluice.scheduler.telemetry.metrics import SchedulerMetrics
from sluice.scheduler.workers.group import WorkerGroup

log = logging.getLogger("sluice.scheduler")


class KvPulls:
    """A pull fails its request (UNAVAILABLE: the prefill replica died, restarted or hangs past kv_pull_timeout);
    with no room for the blocks, the request computes its prompt itself. Either way, and on an abort, the prefill
    replica hears that the lease is over, and the pinned blocks go back."""

    def __init__(self, scheduler: Scheduler, worker: WorkerGroup, metrics: SchedulerMetrics,
                 publish: Callable[[list[RequestUpdate]], None], wake: Callable[[], None]):
        self.scheduler = scheduler
        self.worker = worker
        self.metrics = metrics
        self.prefill = PrefillLinks()
        self._publish = publish
        self._wake = wake
        self._pulling: dict[str, tuple[Request, asyncio.Task]] = {}
        metrics.kv_pulls.set_function(lambda: len(self._pulling))

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pulling

    def __len__(self) -> int:
        return len(self._pulling)

    def start(self, request: Request) -> None:
        self._pulling[request.request_id] = (request, asyncio.create_task(self._run(request)))

    def abort(self, request_id: str) -> None:
        request, task = self._pulling.pop(request_id)
        task.cancel()
        self._publish([_ended(request, FinishReason.ABORT)])

    def cancel_all(self) -> None:
        """The worker is lost: the pulls end (their requests fail with the others)."""
        for _, task in self._pulling.values():
            task.cancel()
        self._pulling.clear()

    async def _run(self, request: Request) -> None:
        params = request.kv_transfer
        try:
            await self._pull(request)
        except SluiceError as error:
            self.metrics.kv_transfer_failures.inc()
            log.warning("request %s: pulling its KV blocks failed: %s", request.request_id, error)
            self.scheduler.block_manager.unpin(request)
            self._pulling.pop(request.request_id, None)
            self._publish([_ended(request, FinishReason.ERROR, error)])
            return
        except asyncio.CancelledError:
            self.scheduler.block_manager.unpin(request)
            raise
        finally:
            self.prefill.release(params)
        self._pulling.pop(request.request_id, None)
        try:
            self.scheduler.add_request(request)
        except SluiceError as error:
            self.scheduler.block_manager.unpin(request)
            self._publish([_ended(request, FinishReason.ERROR, error)])
            return
        self._wake()

    async def _pull(self, request: Request) -> None:
        params, timeout = request.kv_transfer, self.scheduler.config.kv_pull_timeout
        sources = await self.prefill.sources(params, timeout)
        plan = self.scheduler.block_manager.reserve_pull(request, len(params.remote_block_ids))
        if plan is None:
            log.info("request %s: no room to pull its KV blocks; it computes its prompt here", request.request_id)
            return
        if not plan.block_ids:
            return
        started = time.perf_counter()
        remote_block_ids = params.remote_block_ids[plan.first_block:plan.first_block + len(plan.block_ids)]
        num_bytes = await self.worker.pull_kv(sources, remote_block_ids, plan.block_ids, timeout)
        self.metrics.kv_transfer_seconds.observe(time.perf_counter() - started)
        self.metrics.kv_transfer_bytes.inc(num_bytes)
        self.scheduler.block_manager.cache_pulled(request)

    async def close(self) -> None:
        self.cancel_all()
        await self.prefill.close()


def _ended(request: Request, reason: FinishReason, error: SluiceError | None = None) -> RequestUpdate:
    return RequestUpdate(request.client_request_id, [], reason, request.num_prompt_tokens, 0, 0, error=error)
