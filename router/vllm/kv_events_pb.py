"""The scheduler's prefix-cache events in smg's KV event messages (vLLM's BlockStored / BlockRemoved), each batch with
its load record: block hashes cut to their leading 64 bits, as the protocol's int64 block_hash holds, the same cut for
a block, its parent and its removal."""
from smg_grpc_proto.generated import common_pb2

from sluice.router.vllm.info_pb import engine_load_to_vllm_pb
from sluice.v1 import scheduler_pb2


def kv_event_batch_to_vllm_pb(batch: scheduler_pb2.KvEventBatch, block_size: int) -> common_pb2.KvEventBatch:
    events = [_event_to_vllm_pb(event, batch.first_event_id + i, block_size) for i, event in enumerate(batch.events)]
    message = common_pb2.KvEventBatch(sequence_number=batch.sequence_number, timestamp=batch.timestamp, events=events)
    if batch.HasField("load"):
        message.load.CopyFrom(engine_load_to_vllm_pb(batch.load, block_size, batch.load_sample, batch.load_only))
    return message


def block_hash_to_int64(block_hash: bytes) -> int:
    return int.from_bytes(block_hash[:8], "big", signed=True)


def _event_to_vllm_pb(event: scheduler_pb2.KvCacheEvent, event_id: int, block_size: int) -> common_pb2.KvCacheEvent:
    if event.WhichOneof("kind") == "removed":
        removed = common_pb2.KvBlocksRemoved(block_hashes=[block_hash_to_int64(h) for h in event.removed.block_hashes])
        return common_pb2.KvCacheEvent(event_id=event_id, removed=removed)
    stored = event.stored
    token_ids = stored.token_ids
    blocks = [common_pb2.KvBlock(block_hash=block_hash_to_int64(block_hash), block_size=block_size,
                                 token_ids=token_ids[i * block_size:(i + 1) * block_size])
              for i, block_hash in enumerate(stored.block_hashes)]
    message = common_pb2.KvBlocksStored(blocks=blocks)
    if stored.parent_block_hash:
        message.parent_block_hash = block_hash_to_int64(stored.parent_block_hash)
    return common_pb2.KvCacheEvent(event_id=event_id, stored=message)
