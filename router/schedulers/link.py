"""The router's one bidirectional stream to a scheduler, which multiplexes all of its requests."""
import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.core.errors import Unavailable
from sluice.core.finish_reason import FinishReason
from sluice.core.finish_reason_pb import finish_reason_from_pb, finish_reason_to_pb
from sluice.core.images_pb import image_to_pb
from sluice.core.kv_transfer_pb import kv_transfer_from_pb, kv_transfer_to_pb
from sluice.core.logprobs_pb import logprob_rows_from_pb
from sluice.core.sampling_params_pb import sampling_params_to_pb
from sluice.router.schedulers.messages import Event, Failed, Finished, Submission, Tokens, Usage
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("sluice.router")
_SCHEDULER_SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
_UPDATES_AHEAD = 2  # step updates the scheduler may have sent that this router has not dispatched yet
_RECONNECT_SECONDS = 0.2  # between a broken stream or health watch and the next try


class SchedulerLink:
    """The router's one bidirectional stream to a scheduler, multiplexing all of this router's requests.

    Ready while the stream is open and the scheduler reports SERVING, as its health Watch on the same channel pushes
    it: a scheduler that lost its worker keeps the stream but is not ready. When the stream breaks, the requests on
    it fail with UNAVAILABLE and the link reconnects once the scheduler is ready again. `on_ready` hears every change
    of readiness.
    """

    def __init__(self, address: str, on_ready: Callable[[bool], Awaitable[None]] | None = None):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.on_ready = on_ready
        self._outgoing: asyncio.Queue[scheduler_pb2.RouterMessage | None] = asyncio.Queue()  # None ends the stream
        self._streams: dict[str, asyncio.Queue[Event]] = {}
        self._tasks: list[asyncio.Task] = []
        self._connected = False
        self._serving = False
        self._serving_changed = asyncio.Event()

    async def model_info(self, timeout: float) -> generation_pb2.ModelInfo:
        return await self.stub.GetModelInfo(generation_pb2.GetModelInfoRequest(), timeout=timeout,
                                            wait_for_ready=True)

    async def load(self, timeout: float) -> scheduler_pb2.Load:
        return await self.stub.GetLoad(scheduler_pb2.GetLoadRequest(), timeout=timeout)

    def kv_events(self, after_sequence_number: int, load_before_first_batch: bool):
        """The scheduler's prefix-cache event stream, from the batch after the one named, with its load on every
        batch and in load-only batches between them (before its first batch too, where asked)."""
        return self.stub.SubscribeKvEvents(scheduler_pb2.SubscribeKvEventsRequest(
            after_sequence_number=after_sequence_number, load_only_batches=True,
            load_before_first_batch=load_before_first_batch))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch_readiness()), asyncio.create_task(self._keep_connected())]

    @property
    def ready(self) -> bool:
        return self._connected and self._serving

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def submit(self, submission: Submission) -> asyncio.Queue[Event]:
        if not self._connected:
            raise Unavailable(f"no link to the scheduler at {self.address}")
        events: asyncio.Queue[Event] = asyncio.Queue()
        self._streams[submission.request_id] = events
        self._outgoing.put_nowait(scheduler_pb2.RouterMessage(submit=_submit_to_pb(submission)))
        return events

    def finish(self, request_id: str, reason: FinishReason, index: int | None = None) -> bool:
        """Asks the scheduler to end a request (ABORT for a cancel), or one sample of it (STOP for a matched stop
        string)."""
        finish = scheduler_pb2.Finish(request_id=request_id, reason=finish_reason_to_pb(reason), index=index)
        self._outgoing.put_nowait(scheduler_pb2.RouterMessage(finish=finish))
        return request_id in self._streams

    def release(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    async def release_kv(self, request_id: str) -> None:
        """Ends the lease of a prefill leg's blocks whose decode leg never started."""
        try:
            await self.stub.ReleaseKv(scheduler_pb2.ReleaseKvRequest(request_id=request_id), timeout=5)
        except grpc.aio.AioRpcError as error:
            log.warning("could not end the KV lease of %s at %s (it expires on its own): %s", request_id,
                        self.address, error.details())

    async def _keep_connected(self) -> None:
        while True:
            await self._until_serving()
            self._outgoing = asyncio.Queue()  # what was queued for a broken stream is dropped with it
            self._outgoing.put_nowait(_credit(_UPDATES_AHEAD))
            await self._set_connected(True)
            details = await self._read(self.stub.Connect(self._send(self._outgoing)))
            self._outgoing.put_nowait(None)  # ends the broken stream's iterator, which gRPC leaves waiting
            await self._set_connected(False)
            log.error("lost the scheduler link: %s", details)
            for events in self._streams.values():
                events.put_nowait(Failed(grpc.StatusCode.UNAVAILABLE, details))
            self._streams.clear()
            await asyncio.sleep(_RECONNECT_SECONDS)

    async def _watch_readiness(self) -> None:
        """Follows the scheduler's readiness as it pushes it; not serving while it cannot be reached."""
        health = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service=_SCHEDULER_SERVICE)
        while True:
            try:
                async for response in health.Watch(request, wait_for_ready=True):
                    await self._set_serving(response.status == health_pb2.HealthCheckResponse.SERVING)
            except grpc.aio.AioRpcError:
                pass
            await self._set_serving(False)
            await asyncio.sleep(_RECONNECT_SECONDS)

    async def _until_serving(self) -> None:
        while not self._serving:
            self._serving_changed.clear()
            await self._serving_changed.wait()

    async def _set_serving(self, serving: bool) -> None:
        if serving != self._serving:
            log.info("scheduler %s is %s", self.address, "ready" if serving else "not ready")
            self._serving = serving
            self._serving_changed.set()
            await self._readiness_changed()

    async def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        await self._readiness_changed()

    async def _readiness_changed(self) -> None:
        if self.on_ready is not None:
            await self.on_ready(self.ready)

    @staticmethod
    async def _send(outgoing: asyncio.Queue):
        while (message := await outgoing.get()) is not None:
            yield message

    async def _read(self, call) -> str:
        try:
            async for message in call:
                self._dispatch(message.step)
                self._outgoing.put_nowait(_credit(1))
            return "scheduler closed the stream"
        except grpc.aio.AioRpcError as error:
            return f"scheduler {self.address}: {error.code().name} {error.details()}"

    def _dispatch(self, step: scheduler_pb2.StepUpdate) -> None:
        """A merged update lists a request once per step it covers, in step order."""
        tokens: dict[tuple[str, int], Tokens] = {}
        offset = 0
        for request_id, index, count in zip(step.request_ids, step.sample_indices, step.token_counts):
            tokens.setdefault((request_id, index), Tokens(index)).extend(step.token_ids[offset:offset + count])
            offset += count
        for request_id, index, logprobs in _unpacked(step.logprobs):
            tokens.setdefault((request_id, index), Tokens(index)).extend([], logprobs)
        for request_id, index, logprobs in _unpacked(step.prompt_logprobs):
            tokens.setdefault((request_id, index), Tokens(index)).extend([], prompt_logprobs=logprobs)
        for (request_id, _), event in tokens.items():
            events = self._streams.get(request_id)
            if events is not None:
                events.put_nowait(event)
        for message in (*step.finished, *step.rejections):
            events = self._streams.get(message.request_id)
            if events is not None:
                events.put_nowait(_ending_from_pb(message))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.channel.close()


def _unpacked(message: generation_pb2.LogprobRows):
    """(request id, sample index, its Logprobs) of each packed sample."""
    return zip(message.request_ids, message.sample_indices, logprob_rows_from_pb(message).unpacked())


def _credit(messages: int) -> scheduler_pb2.RouterMessage:
    return scheduler_pb2.RouterMessage(credit=scheduler_pb2.Credit(messages=messages))


def _submit_to_pb(submission: Submission) -> scheduler_pb2.Submit:
    return scheduler_pb2.Submit(
        request_id=submission.request_id, prompt_token_ids=submission.prompt_token_ids,
        sampling=sampling_params_to_pb(submission.sampling_params), priority=submission.priority,
        cache_salt=submission.cache_salt, deadline_unix_seconds=submission.deadline_unix_seconds,
        trace_context=submission.trace_context, images=[image_to_pb(image) for image in submission.images],
        kv_transfer=None if submission.kv_transfer is None else kv_transfer_to_pb(submission.kv_transfer))


def _ending_from_pb(message: scheduler_pb2.Finished | scheduler_pb2.Rejection) -> Finished | Failed:
    if isinstance(message, scheduler_pb2.Rejection):
        return Failed(_status_code(message.status_code), message.message)
    if message.deadline_exceeded:
        return Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "the request's deadline passed")
    usage = Usage(message.usage.prompt_tokens, message.usage.completion_tokens, message.usage.cached_tokens)
    return Finished(message.index, finish_reason_from_pb(message.reason), usage,
                    kv_transfer_from_pb(message.kv_transfer))


def _status_code(value: int) -> grpc.StatusCode:
    return next(code for code in grpc.StatusCode if code.value[0] == value)
