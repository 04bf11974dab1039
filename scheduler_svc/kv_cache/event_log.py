"""The prefix cache's events, one numbered batch per engine step, with a bounded history for subscribers that
resume from a cursor."""
import asyncio
import itertools
import time
from collections import deque
from dataclasses import dataclass

from sluice.core.errors import DataLoss, OutOfRange
from sluice.scheduler.kv_cache.events import KvEvent

DEFAULT_HISTORY_BATCHES = 4096


@dataclass(slots=True)
class KvEventBatch:
    sequence_number: int  # 1, 2, ... over the scheduler's life
    timestamp: float  # unix seconds
    first_event_id: int  # the events are numbered on from it, over the scheduler's life
    events: list[KvEvent]


class KvEventLog:
    """A subscriber holds a cursor: the last sequence number it has (0 for none) and reads the batches after it.
    Batch 1 starts from an empty cache, so a subscriber that reads from 0 while batch 1 is still held learns the
    whole cache."""

    def __init__(self, history_batches: int = DEFAULT_HISTORY_BATCHES):
        self._batches: deque[KvEventBatch] = deque(maxlen=history_batches)
        self._last_sequence = 0
        self._last_event_id = 0
        self._num_steps = 0
        self._sealed = asyncio.Event()

    @property
    def last_sequence_number(self) -> int:
        return self._last_sequence

    @property
    def num_steps(self) -> int:
        """The engine steps sealed so far."""
        return self._num_steps

    def seal(self, events: list[KvEvent]) -> None:
        """Ends one engine step: numbers its events as the next batch (a step without any adds none) and wakes the
        readers waiting for it."""
        if events:
            self._last_sequence += 1
            self._batches.append(KvEventBatch(self._last_sequence, time.time(), self._last_event_id + 1, events))
            self._last_event_id += len(events)
        self._num_steps += 1
        self._sealed.set()
        self._sealed = asyncio.Event()

    def check_cursor(self, cursor: int) -> None:
        """OutOfRange for a cursor this log cannot continue: past its last batch (one of a scheduler that has
        restarted since) or before what it still holds."""
        if cursor > self._last_sequence:
            raise OutOfRange(f"start_sequence_number {cursor} is past the last batch, {self._last_sequence}: the "
                             "scheduler restarted; subscribe from 0")
        if cursor and cursor < self._first_held() - 1:
            raise OutOfRange(f"start_sequence_number {cursor} is older than the history, which starts at "
                             f"{self._first_held()}; subscribe from 0")

    def after(self, cursor: int) -> list[KvEventBatch]:
        """The batches after `cursor`; DataLoss when the history has moved past it meanwhile."""
        first = self._first_held()
        if cursor and cursor < first - 1:
            raise DataLoss(f"the subscriber fell behind: it has batch {cursor}, the history starts at {first}")
        return list(itertools.islice(self._batches, max(cursor - first + 1, 0), None))

    async def wait_for_step(self, num_steps: int) -> None:
        """Returns once more than `num_steps` engine steps have been sealed."""
        while self._num_steps <= num_steps:
            await self._sealed.wait()

    def _first_held(self) -> int:
        return self._batches[0].sequence_number if self._batches else self._last_sequence + 1
