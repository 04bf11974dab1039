"""Physical KV blocks: ref counts, the free queue and the hash -> cached block map."""
from collections import OrderedDict
from dataclasses import dataclass

from sluice.scheduler.kv_cache.events import KvEventRecorder
from sluice.scheduler.kv_cache.prefix_hash import BlockHash


@dataclass(slots=True, eq=False)
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None  # set once the block is full, computed and registered in the cache


class BlockPool:
    """Blocks no request holds wait in the free queue, least recently freed first.

    A freed block that holds a cached prefix keeps its hash, so a later request can take it back from the queue
    (a cache hit) until allocation reaches it and evicts it. Freed blocks without a hash are worth nothing and go
    to the front, so they are reused before any cached block is evicted.
    """

    def __init__(self, num_blocks: int, recorder: KvEventRecorder):
        if num_blocks < 1:
            raise ValueError(f"a KV block pool needs at least one block, got {num_blocks}")
        self.recorder = recorder
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_queue)

    def allocate(self, num_blocks: int) -> list[KVBlock]:
        if num_blocks > len(self._free_queue):
            raise ValueError(f"asked for {num_blocks} blocks, {len(self._free_queue)} free")
        blocks = []
        for _ in range(num_blocks):
            _, block = self._free_queue.popitem(last=False)
            self._evict(block)
            block.ref_count = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: list[KVBlock]) -> None:
        """Takes one more reference on each block; a cached block leaves the free queue."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free_queue[block.block_id]
            block.ref_count += 1

    def free(self, blocks: list[KVBlock]) -> None:
        """Drops one reference from each block; pass them in eviction order (first evicted first)."""
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free_queue[block.block_id] = block
                if block.block_hash is None:
                    self._free_queue.move_to_end(block.block_id, last=False)

    def lookup(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def cache(self, block: KVBlock, block_hash: BlockHash) -> bool:
        """Registers a full, computed block under its hash; a hash already cached keeps its first block. Returns
        whether the block was registered."""
        if block.block_hash is None and block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block
            return True
        return False

    def evict_all_cached(self) -> int:
        """Forgets every cached block that no request holds; returns how many."""
        evicted = 0
        for block in self._free_queue.values():
            if block.block_hash is not None:
                self._evict(block)
                evicted += 1
        for block_id in [i for i, b in self._free_queue.items() if b.block_hash is None]:
            self._free_queue.move_to_end(block_id, last=False)
        return evicted

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            self.recorder.removed(block.block_hash)
            block.block_hash = None
