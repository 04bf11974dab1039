"""Pairs a prefill pool and a decode pool of scheduler replicas: each request prefills on one replica, which holds
its prompt's blocks, then decodes on another, which pulls them."""
import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from sluice.core.errors import InvalidArgument, SluiceError, Unavailable, Unimplemented
from sluice.core.finish_reason import FinishReason
from sluice.core.kv_transfer import KvTransferParams
from sluice.router.schedulers.link import SchedulerLink
from sluice.router.schedulers.messages import Event, Failed, Finished, Submission
from sluice.router.schedulers.pool import SchedulerPool
from sluice.serving.grpc_errors import status_for


class DisaggregatedPool:
    """SchedulerPool's face over two pools, each balanced by load as SchedulerPool balances. The prefill leg asks
    for do_remote_decode and ends at its first token; its output is dropped, and the decode leg, given the prefill
    leg's kv_transfer params, computes the first token again from the pulled prompt (as vLLM's decode side does) and
    streams the rest. A prefill leg that ends for good at its first token (EOS) is the request's whole output. A
    request of one token or several samples is no pair: the prefill pool or the decode pool serves it whole. Ready
    while both pools are."""

    def __init__(self, prefill: SchedulerPool, decode: SchedulerPool,
                 on_ready: Callable[[bool], Awaitable[None]] | None = None):
        self.prefill, self.decode = prefill, decode
        self.on_ready = on_ready
        prefill.on_ready = decode.on_ready = self._pool_changed
        self.links = [*prefill.links, *decode.links]
        self._legs: dict[str, SchedulerPool] = {}  # request id -> the pool of its leg in flight
        self._pairs: dict[str, asyncio.Task] = {}
        self._lease_releases: set[asyncio.Task] = set()

    @property
    def ready(self) -> bool:
        return self.prefill.ready and self.decode.ready

    async def model_info(self, timeout: float):
        prefill, decode = await asyncio.gather(self.prefill.model_info(timeout), self.decode.model_info(timeout))
        if (prefill.model, prefill.vocab_size, prefill.block_size) != (decode.model, decode.vocab_size,
                                                                         decode.block_size):
            raise ValueError(f"the prefill replicas serve {prefill.model} in blocks of {prefill.block_size}, the "
                             f"decode replicas {decode.model} in blocks of {decode.block_size}")
        info = type(decode)()
        info.CopyFrom(min(prefill, decode, key=lambda info: info.max_model_len))
        info.kv_role = "both"  # to its clients, the pair serves whole requests
        return info

    async def loads(self, timeout: float) -> list:
        """The decode replicas' loads: where a request's tokens come from."""
        return await self.decode.loads(timeout)

    @property
    def num_in_flight(self) -> int:
        return len(self._legs)

    def kv_events(self, after_sequence_number: int, load_before_first_batch: bool):
        raise Unimplemented("this router pairs prefill and decode replicas: their KV events are not relayed")

    def start(self) -> None:
        self.prefill.start()
        self.decode.start()

    def submit(self, submission: Submission) -> asyncio.Queue[Event]:
        request_id = submission.request_id
        if request_id in self._legs:
            raise InvalidArgument("request_id", f"{request_id!r} duplicates a request in flight")
        params = submission.sampling_params
        if params.max_tokens <= 1 or params.n > 1:
            pool = self.prefill if params.max_tokens <= 1 else self.decode
            events = pool.submit(submission)
            self._legs[request_id] = pool
            return events
        prefill_events = self.prefill.submit(
            dataclasses.replace(submission, kv_transfer=KvTransferParams(do_remote_decode=True)))
        self._legs[request_id] = self.prefill
        events: asyncio.Queue[Event] = asyncio.Queue()
        self._pairs[request_id] = asyncio.create_task(
            self._pair(submission, self.prefill.owner(request_id), prefill_events, events))
        return events

    async def _pair(self, submission: Submission, prefill_link: SchedulerLink, prefill_events: asyncio.Queue,
                    events: asyncio.Queue) -> None:
        request_id = submission.request_id
        try:
            kv_transfer = await self._prefill_leg(prefill_events, events)
        except asyncio.CancelledError:
            self._release_unclaimed_lease(prefill_link, request_id, prefill_events)
            raise
        if kv_transfer is None:
            return
        self.prefill.release(request_id)
        try:
            decode_events = self.decode.submit(dataclasses.replace(submission, kv_transfer=kv_transfer))
        except SluiceError as error:
            self._release_lease(prefill_link, request_id)
            events.put_nowait(Failed(status_for(error), str(error)))
            return
        self._legs[request_id] = self.decode
        while True:
            events.put_nowait(await decode_events.get())

    @staticmethod
    async def _prefill_leg(prefill_events: asyncio.Queue, events: asyncio.Queue) -> KvTransferParams | None:
        """The params of the prefill leg's held blocks; None when its events are the request's whole output (it
        failed, or ended for good at its first token), which go to `events`."""
        held = []
        while True:
            event = await prefill_events.get()
            if isinstance(event, Finished) and event.kv_transfer is not None:
                return event.kv_transfer
            held.append(event)
            if isinstance(event, (Finished, Failed)):
                for event in held:
                    events.put_nowait(event)
                return None

    def _release_unclaimed_lease(self, link: SchedulerLink, request_id: str, prefill_events: asyncio.Queue) -> None:
        """A client that left between the legs: the lease its prefill leg took ends now."""
        while not prefill_events.empty():
            event = prefill_events.get_nowait()
            if isinstance(event, Finished) and event.kv_transfer is not None:
                self._release_lease(link, request_id)

    def _release_lease(self, link: SchedulerLink, request_id: str) -> None:
        task = asyncio.create_task(link.release_kv(request_id))
        self._lease_releases.add(task)
        task.add_done_callback(self._lease_releases.discard)

    def submit_elsewhere(self, submission: Submission) -> asyncio.Queue[Event]:
        raise Unavailable("a leg of a disaggregated request failed")

    def finish(self, request_id: str, reason: FinishReason, index: int | None = None) -> bool:
        pool = self._legs.get(request_id)
        return pool is not None and pool.finish(request_id, reason, index)

    def release(self, request_id: str) -> None:
        pair = self._pairs.pop(request_id, None)
        if pair is not None:
            pair.cancel()
        pool = self._legs.pop(request_id, None)
        if pool is not None:
            pool.release(request_id)

    async def _pool_changed(self, ready: bool) -> None:
        if self.on_ready is not None:
            await self.on_ready(self.ready)

    async def close(self) -> None:
        await asyncio.gather(self.prefill.close(), self.decode.close())
