"""The prefix cache's stored and removed events, and the numbered history subscribers read them from."""
import pytest

from sluice.core.errors import DataLoss, OutOfRange
from sluice.scheduler.kv_cache.event_log import KvEventLog
from sluice.scheduler.kv_cache.events import BlocksRemoved, BlocksStored
from sluice.scheduler.kv_cache.prefix_hash import ROOT_PARENT_HASH, hash_block
from tests.scheduler.sched_testkit import FakeWorker, make_request, make_scheduler, run_to_completion

BLOCK = 16


def _finish(scheduler, worker, request):
    scheduler.add_request(request)
    run_to_completion(scheduler, worker)
    return scheduler.block_manager.take_kv_events()


def test_a_prompt_stores_its_full_blocks_as_one_chain_and_a_longer_one_extends_it():
    scheduler, worker = make_scheduler(num_blocks=32), FakeWorker(block_size=BLOCK)
    shared = list(range(1, 41))
    [first] = _finish(scheduler, worker, make_request("a", shared, max_tokens=1))
    block_0 = hash_block(ROOT_PARENT_HASH, shared[:16])
    block_1 = hash_block(block_0, shared[16:32])
    assert first == BlocksStored([block_0, block_1], None, shared[:32])
    longer = shared + list(range(100, 110))
    [second] = _finish(scheduler, worker, make_request("b", longer, max_tokens=1))
    assert second == BlocksStored([hash_block(block_1, longer[32:48])], block_1, longer[32:48])


def test_replaying_the_events_gives_the_cache_through_evictions():
    scheduler, worker = make_scheduler(num_blocks=10), FakeWorker(block_size=BLOCK)
    cached, num_removed = set(), 0
    for i in range(12):
        prompt = list(range(1, 33)) + [1000 + i] * 20 if i % 3 else 52 * [2000 + i]  # some share two blocks
        for event in _finish(scheduler, worker, make_request(f"r{i}", prompt, max_tokens=3)):
            if isinstance(event, BlocksStored):
                assert len(event.token_ids) == BLOCK * len(event.block_hashes)
                assert event.parent_block_hash is None or event.parent_block_hash in cached
                assert cached.isdisjoint(event.block_hashes)
                cached.update(event.block_hashes)
            else:
                assert cached.issuperset(event.block_hashes)
                cached.difference_update(event.block_hashes)
                num_removed += len(event.block_hashes)
    assert num_removed > 0
    assert cached == {block.block_hash for block in scheduler.block_manager.pool.blocks if block.block_hash}


def test_dropping_the_cache_removes_every_block():
    scheduler, worker = make_scheduler(num_blocks=32), FakeWorker(block_size=BLOCK)
    [stored] = _finish(scheduler, worker, make_request("a", 40, max_tokens=1))
    scheduler.abort_all()
    [removed] = scheduler.block_manager.take_kv_events()
    assert removed == BlocksRemoved(stored.block_hashes[::-1])  # in eviction order: a sequence's tail first


def _removed(tag: int) -> list:
    return [BlocksRemoved([bytes([tag]) * 32])]


def test_a_cursor_reads_the_batches_after_it_and_the_history_is_bounded():
    log = KvEventLog(history_batches=3)
    log.seal([])
    assert log.last_sequence_number == 0
    for tag in range(1, 6):
        log.seal(_removed(tag))
    assert [b.sequence_number for b in log.after(0)] == [3, 4, 5]  # what is still held
    assert [b.sequence_number for b in log.after(3)] == [4, 5]
    assert [b.first_event_id for b in log.after(2)] == [3, 4, 5]
    assert log.after(5) == []
    log.check_cursor(2)
    with pytest.raises(OutOfRange, match="older than the history"):
        log.check_cursor(1)
    with pytest.raises(OutOfRange, match="restarted"):
        log.check_cursor(6)
    with pytest.raises(DataLoss, match="fell behind"):
        log.after(1)
