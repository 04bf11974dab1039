"""The prefix cache's changes, as vLLM publishes them: full blocks stored under their chained hashes, and evicted."""
from dataclasses import dataclass, field

from sluice.scheduler.kv_cache.prefix_hash import BlockHash


@dataclass(slots=True)
class BlocksStored:
    block_hashes: list[BlockHash]  # consecutive blocks of one sequence, parents first
    parent_block_hash: BlockHash | None  # the block before the first one; None when the first one starts a sequence
    token_ids: list[int]  # block_size tokens per block, in block order


@dataclass(slots=True)
class BlocksRemoved:
    block_hashes: list[BlockHash]


KvEvent = BlocksStored | BlocksRemoved


@dataclass(slots=True)
class KvEventRecorder:
    """Collects the events of one engine step, for the step's end to take in one piece."""

    events: list[KvEvent] = field(default_factory=list)

    def stored(self, event: BlocksStored) -> None:
        self.events.append(event)

    def removed(self, block_hash: BlockHash) -> None:
        if self.events and isinstance(self.events[-1], BlocksRemoved):
            self.events[-1].block_hashes.append(block_hash)
        else:
            self.events.append(BlocksRemoved([block_hash]))

    def take(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events
