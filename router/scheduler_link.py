import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc

from sluice.core.errors import Unavailable
from sluice.core.logprobs import Logprobs
from sluice.core.logprobs_pb import logprobs_from_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.serving.readiness import wait_until_serving
from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("sluice.router")
_SCHEDULER_SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
_UPDATES_AHEAD = 2  # step updates the scheduler may have sent that this router has not dispatched yet


@dataclass(slots=True)
class Tokens:
    index: int  # the sample
    token_ids: list[int] = field(default_factory=list)
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None

    def extend(self, token_ids, logprobs: Logprobs | None = None, prompt_logprobs: Logprobs | None = None) -> None:
        """Appends a later step's news."""
        self.token_ids += token_ids
        self.logprobs = _joined(self.logprobs, logprobs)
        self.prompt_logprobs = _joined(self.prompt_logprobs, prompt_logprobs)


@dataclass(slots=True)
class LinkLost:
    details: str


Event = Tokens | scheduler_pb2.Finished | scheduler_pb2.Rejection | LinkLost


class SchedulerLink:
    """The router's one bidirectional stream to a scheduler, multiplexing all of this router's requests.

    When the stream breaks, the requests on it end with LinkLost (UNAVAILABLE to their clients), `on_connected`
    hears False, and the link waits for the scheduler to be ready again, reconnects, and `on_connected` hears True.
    """

    def __init__(self, address: str, on_connected: Callable[[bool], Awaitable[None]] | None = None):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.on_connected = on_connected
        self._outgoing: asyncio.Queue[scheduler_pb2.RouterMessage] = asyncio.Queue()
        self._streams: dict[str, asyncio.Queue[Event]] = {}
        self._reader: asyncio.Task | None = None
        self._connected = False

    async def model_info(self, timeout: float) -> generation_pb2.ModelInfo:
        return await self.stub.GetModelInfo(generation_pb2.GetModelInfoRequest(), timeout=timeout,
                                            wait_for_ready=True)

    def start(self) -> None:
        self._reader = asyncio.create_task(self._keep_connected())

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def submit(self, submit: scheduler_pb2.Submit) -> asyncio.Queue[Event]:
        if not self._connected:
            raise Unavailable(f"no link to the scheduler at {self.address}")
        events: asyncio.Queue[Event] = asyncio.Queue()
        self._streams[submit.request_id] = events
        self._outgoing.put_nowait(scheduler_pb2.RouterMessage(submit=submit))
        return events

    def finish(self, request_id: str, reason: int, index: int | None = None) -> bool:
        """Asks the scheduler to end a request (ABORT for a cancel), or one sample of it (STOP for a matched stop
        string)."""
        finish = scheduler_pb2.Finish(request_id=request_id, reason=reason, index=index)
        self._outgoing.put_nowait(scheduler_pb2.RouterMessage(finish=finish))
        return request_id in self._streams

    def release(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    async def _keep_connected(self) -> None:
        while True:
            self._outgoing = asyncio.Queue()  # what was queued for a broken stream is dropped with it
            self._outgoing.put_nowait(_credit(_UPDATES_AHEAD))
            await self._set_connected(True)
            details = await self._read(self.stub.Connect(self._send(self._outgoing)))
            await self._set_connected(False)
            log.error("lost the scheduler link: %s", details)
            for events in self._streams.values():
                events.put_nowait(LinkLost(details))
            self._streams.clear()
            await wait_until_serving(self.channel, _SCHEDULER_SERVICE, timeout=float("inf"))
            log.info("scheduler %s is ready again: reconnecting", self.address)

    async def _set_connected(self, connected: bool) -> None:
        self._connected = connected
        if self.on_connected is not None:
            await self.on_connected(connected)

    @staticmethod
    async def _send(outgoing: asyncio.Queue):
        while True:
            yield await outgoing.get()

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
        for message in step.logprobs:
            tokens.setdefault((message.request_id, message.index), Tokens(message.index)).extend(
                [], logprobs_from_pb(message.logprobs) if message.HasField("logprobs") else None,
                logprobs_from_pb(message.prompt_logprobs) if message.HasField("prompt_logprobs") else None)
        for (request_id, _), event in tokens.items():
            events = self._streams.get(request_id)
            if events is not None:
                events.put_nowait(event)
        for message in (*step.finished, *step.rejections):
            events = self._streams.get(message.request_id)
            if events is not None:
                events.put_nowait(message)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.channel.close()


def _credit(messages: int) -> scheduler_pb2.RouterMessage:
    return scheduler_pb2.RouterMessage(credit=scheduler_pb2.Credit(messages=messages))


def _joined(first: Logprobs | None, second: Logprobs | None) -> Logprobs | None:
    if first is None or second is None:
        return second if first is None else first
    first.extend(second)
    return first
