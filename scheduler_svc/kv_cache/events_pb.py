"""The prefix cache's event batches in scheduler.proto."""
from sluice.scheduler.kv_cache.event_log import KvEventBatch
from sluice.scheduler.kv_cache.events import BlocksStored, KvEvent
from sluice.v1 import scheduler_pb2


def kv_event_batch_to_pb(batch: KvEventBatch) -> scheduler_pb2.KvEventBatch:
    return scheduler_pb2.KvEventBatch(sequence_number=batch.sequence_number, timestamp=batch.timestamp,
                                      first_event_id=batch.first_event_id,
                                      events=[_event_to_pb(event) for event in batch.events])


def _event_to_pb(event: KvEvent) -> scheduler_pb2.KvCacheEvent:
    if isinstance(event, BlocksStored):
        return scheduler_pb2.KvCacheEvent(stored=scheduler_pb2.KvBlocksStored(
            block_hashes=event.block_hashes, parent_block_hash=event.parent_block_hash or b"",
            token_ids=event.token_ids))
    return scheduler_pb2.KvCacheEvent(removed=scheduler_pb2.KvBlocksRemoved(block_hashes=event.block_hashes))
