"""The load the scheduler streams to a gateway: the engine's silence while steps are in flight, the prefill it holds,
and a subscriber's stream of KV event batches with the load on each, load-only batches when the load changes at a
step's end without an event, and heartbeats while the stream is quiet."""
import asyncio
import time
from dataclasses import replace

from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.kv_cache.event_log import KvEventLog
from sluice.scheduler.kv_cache.events import BlocksRemoved
from sluice.scheduler.outputs import LoadSnapshot
from sluice.scheduler.routers.kv_event_stream import kv_event_stream
from sluice.scheduler.scheduler import Scheduler
from tests.scheduler.sched_testkit import EOS, FakeWorker, make_request, make_scheduler, run_to_completion

BLOCK = 16
HEARTBEAT = 0.2


class Clock:
    """Moved by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_silence_runs_from_the_last_outcome_or_the_send_that_ended_an_idle_spell():
    clock, worker = Clock(), FakeWorker(block_size=BLOCK)
    scheduler = Scheduler(SchedulerConfig(num_blocks=64, block_size=BLOCK), {EOS}, clock=clock)
    clock.now += 600  # idle: no silence however long
    scheduler.add_request(make_request("a", 20, max_tokens=3))
    assert scheduler.get_load().engine_silence is None
    first = scheduler.schedule()
    clock.now += 2.5
    assert scheduler.get_load().engine_silence == 2.5
    second = scheduler.schedule()  # the next step queued behind the first does not restart the count
    clock.now += 1.0
    assert scheduler.get_load().engine_silence == 3.5
    scheduler.update_from_outcome(first, worker.execute(first))
    clock.now += 0.25
    assert scheduler.get_load().engine_silence == 0.25
    scheduler.update_from_outcome(second, worker.execute(second))
    assert scheduler.get_load().engine_silence is None
    run_to_completion(scheduler, worker)
    scheduler.add_request(make_request("b", 20))
    scheduler.schedule()
    clock.now += 7
    scheduler.abort_all()  # the worker is lost: nothing is in flight
    assert scheduler.get_load().engine_silence is None


def test_the_prefill_pending_is_the_waiting_tokens_and_the_uncached_prompts_without_a_token():
    scheduler, worker = make_scheduler(num_blocks=64, block_size=BLOCK), FakeWorker(block_size=BLOCK)
    shared = list(range(1, 41))
    scheduler.add_request(make_request("a", shared, max_tokens=4))
    assert scheduler.get_load().num_prefill_pending_tokens == 40
    plan = scheduler.schedule()
    assert scheduler.get_load().num_prefill_pending_tokens == 40  # in flight: no token yet
    scheduler.update_from_outcome(plan, worker.execute(plan))
    assert scheduler.get_load().num_prefill_pending_tokens == 0
    run_to_completion(scheduler, worker)
    scheduler.add_request(make_request("b", shared + list(range(100, 110)), max_tokens=2))
    scheduler.add_request(make_request("c", 30, max_tokens=2))
    plan = scheduler.schedule()  # b finds its first two blocks cached
    assert scheduler.get_load().num_prefill_pending_tokens == (50 - 32) + 30
    scheduler.update_from_outcome(plan, worker.execute(plan))
    run_to_completion(scheduler, worker)
    assert scheduler.get_load().num_prefill_pending_tokens == 0


def test_a_reader_wakes_at_the_next_step_end_with_or_without_events():
    async def scenario():
        log = KvEventLog()
        for events in ([], [BlocksRemoved([b"\1" * 32])]):
            waiter = asyncio.create_task(log.wait_for_step(log.num_steps))
            await asyncio.sleep(0)
            assert not waiter.done()
            log.seal(events)
            await asyncio.wait_for(waiter, 1)
        await asyncio.wait_for(log.wait_for_step(1), 1)  # a step ended since the one named
        assert (log.num_steps, log.last_sequence_number) == (2, 1)

    asyncio.run(scenario())


def _load(**numbers) -> LoadSnapshot:
    return replace(LoadSnapshot(num_running=0, num_waiting=0, num_used_blocks=0, num_free_blocks=64,
                                num_total_blocks=64, prefix_cache_hit_rate=0.0, num_preemptions=0, engine_silence=None,
                                num_prefill_pending_tokens=0), **numbers)


class Reader:
    """A subscriber's stream, read without cancelling it."""

    def __init__(self, log: KvEventLog, load, cursor: int = 0, load_only_batches: bool = True,
                 load_before_first_batch: bool = True):
        self.load = load
        self._stream = kv_event_stream(log, lambda: self.load, cursor, load_only_batches, load_before_first_batch,
                                       heartbeat=HEARTBEAT)
        self._next = None

    async def next(self, within: float = 1.0):
        """The next batch, or None when none comes within `within` seconds."""
        self._next = self._next or asyncio.ensure_future(anext(self._stream))
        done, _ = await asyncio.wait([self._next], timeout=within)
        if not done:
            return None
        loaded, self._next = self._next.result(), None
        return loaded

    async def close(self):
        if self._next is not None:
            self._next.cancel()
        await self._stream.aclose()


def _removed(tag: int) -> list:
    return [BlocksRemoved([bytes([tag]) * 32])]


def test_each_batch_carries_the_load_and_the_samples_number_the_stream():
    async def scenario():
        log = KvEventLog()
        log.seal(_removed(1))
        log.seal(_removed(2))
        reader = Reader(log, _load(num_running=2))
        first, second = await reader.next(), await reader.next()
        assert [b.batch.sequence_number for b in (first, second)] == [1, 2]
        assert [b.load_sample for b in (first, second)] == [1, 2]
        assert not first.load_only and first.load.num_running == 2 and first.batch.events == _removed(1)
        reader.load = _load(num_running=3)
        log.seal(_removed(3))
        third = await reader.next()
        assert (third.batch.sequence_number, third.load_sample, third.load.num_running) == (3, 3, 3)
        await reader.close()

    asyncio.run(scenario())


def test_a_step_that_changes_the_load_without_an_event_sends_it_alone_and_one_that_does_not_sends_nothing():
    async def scenario():
        log = KvEventLog()
        log.seal(_removed(1))
        reader = Reader(log, _load(num_running=1))
        assert (await reader.next()).batch.sequence_number == 1
        log.seal([])
        assert await reader.next(within=HEARTBEAT / 2) is None  # the load is as sent
        reader.load = _load()
        log.seal([])  # a completion: no block was evicted
        alone = await reader.next(within=HEARTBEAT / 2)
        assert alone.load_only and alone.batch.events == [] and alone.batch.sequence_number == 1
        assert (alone.load_sample, alone.load.num_running) == (2, 0)
        await reader.close()

    asyncio.run(scenario())


def test_a_quiet_stream_sends_heartbeats_that_show_the_silence_grow():
    async def scenario():
        log = KvEventLog()
        log.seal(_removed(1))
        reader = Reader(log, _load(num_running=1, engine_silence=0.0))
        await reader.next()
        started = time.monotonic()
        beats = []
        for silence in (0.2, 0.4):
            reader.load = _load(num_running=1, engine_silence=silence)
            beats.append(await reader.next(within=2 * HEARTBEAT))
        assert all(beat.load_only and beat.batch.sequence_number == 1 for beat in beats)
        assert [beat.load.engine_silence for beat in beats] == [0.2, 0.4]
        assert time.monotonic() - started >= 2 * HEARTBEAT * 0.9
        await reader.close()

    asyncio.run(scenario())


def test_load_only_batches_before_the_first_batch_come_numbered_0_only_where_asked():
    async def scenario():
        log = KvEventLog()
        asked, not_asked = Reader(log, _load()), Reader(log, _load(), load_before_first_batch=False)
        first = await asked.next(within=HEARTBEAT / 2)  # at once: the stream's first record
        assert first.load_only and first.batch.sequence_number == 0 and first.load_sample == 1
        assert (await asked.next(within=2 * HEARTBEAT)).batch.sequence_number == 0
        assert await not_asked.next(within=2 * HEARTBEAT) is None
        log.seal(_removed(1))
        from_first = await not_asked.next()
        assert (from_first.batch.sequence_number, from_first.load_sample, from_first.load_only) == (1, 1, False)
        assert (await not_asked.next(within=2 * HEARTBEAT)).load_only
        await asked.close()
        await not_asked.close()

    asyncio.run(scenario())


def test_a_subscriber_that_takes_no_load_only_batches_gets_the_events_alone():
    async def scenario():
        log = KvEventLog()
        log.seal(_removed(1))
        reader = Reader(log, _load(), cursor=1, load_only_batches=False)
        reader.load = _load(num_running=4)
        log.seal([])
        assert await reader.next(within=2 * HEARTBEAT) is None
        log.seal(_removed(2))
        batch = await reader.next()
        assert (batch.batch.sequence_number, batch.load_only, batch.load.num_running) == (2, False, 4)
        log.seal(_removed(3))  # while the stream waits for its reader to take batch 2
        assert (await reader.next(within=HEARTBEAT)).batch.sequence_number == 3
        await reader.close()

    asyncio.run(scenario())


def test_a_resumed_stream_with_nothing_to_replay_sends_its_load_at_once():
    async def scenario():
        log = KvEventLog()
        log.seal(_removed(1))
        reader = Reader(log, _load(num_waiting=5), cursor=1, load_before_first_batch=False)
        resumed = await reader.next(within=HEARTBEAT / 2)
        assert resumed.load_only and resumed.batch.sequence_number == 1 and resumed.load.num_waiting == 5
        await reader.close()

    asyncio.run(scenario())
