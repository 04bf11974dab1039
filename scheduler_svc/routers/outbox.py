"""The step updates waiting for one router's stream, sent as far ahead as its credit allows."""
import asyncio

from sluice.v1 import scheduler_pb2 as pb


class Outbox:
    """The step updates waiting for one router's stream.

    A router that grants credit is sent at most that many messages ahead of its reading, and the updates that wait
    for credit go out as one merged message (a request then appears once per step, in step order). A router that
    grants none is sent each update as it is.
    """

    def __init__(self):
        self._waiting: list[pb.StepUpdate] = []
        self._credit: int | None = None  # None: the router takes every update as it comes
        self._changed = asyncio.Event()

    def put(self, update: pb.StepUpdate) -> None:
        self._waiting.append(update)
        self._changed.set()

    def grant(self, messages: int) -> None:
        self._credit = (self._credit or 0) + messages
        self._changed.set()

    async def get(self) -> pb.SchedulerMessage:
        while not self._waiting or self._credit == 0:
            self._changed.clear()
            await self._changed.wait()
        if self._credit is None:
            return pb.SchedulerMessage(step=self._waiting.pop(0))
        self._credit -= 1
        step, *later = self._waiting
        self._waiting = []
        for update in later:
            step.MergeFrom(update)
        return pb.SchedulerMessage(step=step)
