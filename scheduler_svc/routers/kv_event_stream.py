"""One subscriber's KV event stream: the log's batches after its cursor, each with the scheduler's load as it is
sent, and load-only batches between them, so that a gateway reads the load at every engine step and sees a worker go
silent. A load-only batch goes out when a step ends with the load changed and no event, and as a heartbeat once the
stream has been quiet for HEARTBEAT_SECONDS (the engine idle, or wedged while its silence grows)."""
import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sluice.scheduler.kv_cache.event_log import KvEventBatch, KvEventLog
from sluice.scheduler.outputs import LoadSnapshot

HEARTBEAT_SECONDS = 1.0  # a gateway sees a silence within a second past its bound (smg's default: 3 s)


@dataclass(slots=True)
class LoadedBatch:
    """One message of the stream."""

    batch: KvEventBatch  # a load-only one has no events and repeats the last sequence number sent (0 before any)
    load: LoadSnapshot
    load_sample: int  # 1, 2, ... on the stream
    load_only: bool


async def kv_event_stream(log: KvEventLog, load: Callable[[], LoadSnapshot], cursor: int, load_only_batches: bool,
                          load_before_first_batch: bool,
                          heartbeat: float = HEARTBEAT_SECONDS) -> AsyncIterator[LoadedBatch]:
    """The batches after `cursor`, and where `load_only_batches`, load-only ones: numbered 0 before the log's first
    batch only where `load_before_first_batch`. Raises DataLoss when the subscriber falls behind the history."""
    samples = itertools.count(1)
    sent: LoadSnapshot | None = None
    quiet_since = time.monotonic()
    while True:
        num_steps, batches, current = log.num_steps, log.after(cursor), load()
        for batch in batches:
            yield LoadedBatch(batch, current, next(samples), load_only=False)
            cursor = batch.sequence_number
        may_send_load_only = load_only_batches and bool(cursor or load_before_first_batch)
        load_only_due = not batches and may_send_load_only and (
            sent is None or _moved(sent, current) or time.monotonic() - quiet_since >= heartbeat)
        if load_only_due:
            yield LoadedBatch(KvEventBatch(cursor, time.time(), 0, []), current, next(samples), load_only=True)
        if batches or load_only_due:
            sent, quiet_since = current, time.monotonic()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(quiet_since + heartbeat - time.monotonic() if may_send_load_only else None):
                await log.wait_for_step(num_steps)  # at once if a step ended while the subscriber read


def _moved(before: LoadSnapshot, now: LoadSnapshot) -> bool:
    """Whether a number a gateway routes by changed."""
    return ((before.num_running, before.num_waiting, before.num_used_blocks, before.num_prefill_pending_tokens)
            != (now.num_running, now.num_waiting, now.num_used_blocks, now.num_prefill_pending_tokens))
