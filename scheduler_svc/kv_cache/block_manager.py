"""Per-request block tables over the BlockPool, with automatic prefix caching (vLLM v1's KVCacheManager); for a model
whose every layer has a sliding window, the blocks before a request's window go back to the pool as it advances
(vLLM's SlidingWindowManager)."""
from dataclasses import dataclass
from typing import NamedTuple

from sluice.scheduler.kv_cache.block_pool import BlockPool, KVBlock
from sluice.scheduler.kv_cache.events import BlocksStored, KvEvent, KvEventRecorder
from sluice.scheduler.kv_cache.prefix_hash import BlockHash, extend_block_hashes
from sluice.scheduler.request import Request


class PrefixHit(NamedTuple):
    """Cached blocks that hold a request's leading tokens; opaque to the scheduler, passed back to allocate_slots."""

    blocks: list[KVBlock]
    num_tokens: int


NO_PREFIX_HIT = PrefixHit([], 0)
RELEASED_BLOCK_ID = 0  # the worker's entry for a block before the window: attention never reads it


@dataclass(slots=True)
class PullPlan:
    first_block: int  # the request's first block to pull: the prefix cache holds those before it
    block_ids: list[int]  # where the pulled blocks go, in order


@dataclass(slots=True)
class ForkResult:
    block_ids: list[int]  # the child's block table
    copies: list[tuple[int, int]]  # (source, destination) block ids the worker must copy before the child writes


class BlockManager:
    """Only full blocks are ever shared (prefix hits, forks); a request's partial last block is always private, so a
    shared block is never written in place. A table's entry is None once its block is released (attention_window)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 attention_window: int = 0):
        """attention_window: tokens back from its newest that a query reads (0: the whole context)."""
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.attention_window = attention_window
        self.kv_events = KvEventRecorder()
        self.pool = BlockPool(num_blocks, self.kv_events)
        self._tables: dict[str, list[KVBlock | None]] = {}
        self._block_hashes: dict[str, list[BlockHash]] = {}
        self._num_registered_blocks: dict[str, int] = {}  # leading blocks of a table already offered to the cache
        self._num_released_blocks: dict[str, int] = {}  # leading blocks of a table released, outside the window
        self._pins: dict[str, list[KVBlock]] = {}  # a decode leg's prompt blocks, held from its pull to its start
        self.num_prefix_query_tokens = 0
        self.num_prefix_hit_tokens = 0

    @property
    def num_total_blocks(self) -> int:
        return len(self.pool.blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.pool.num_free_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_prefix_hit_tokens / self.num_prefix_query_tokens if self.num_prefix_query_tokens else 0.0

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks(self, request_id: str) -> int:
        return len(self._tables.get(request_id, ()))

    def block_ids(self, request_id: str) -> list[int]:
        return [RELEASED_BLOCK_ID if block is None else block.block_id for block in self._tables.get(request_id, ())]

    def get_computed_blocks(self, request: Request, num_tokens_to_compute: int = 1) -> PrefixHit:
        """The longest cached prefix of the request's tokens, in whole blocks, short of its last
        `num_tokens_to_compute` tokens (the step must compute at least one token to have logits to sample from)."""
        if not self.enable_prefix_caching:
            return NO_PREFIX_HIT
        hashes = self._hashes(request)
        max_hit_blocks = (request.num_tokens - num_tokens_to_compute) // self.block_size
        blocks = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            blocks.append(block)
        return PrefixHit(blocks, len(blocks) * self.block_size)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       prefix_hit: PrefixHit | None = None) -> list[int] | None:
        """Makes room for `num_new_tokens` more tokens after the computed ones. A request without blocks yet passes
        its prefix hit (from get_computed_blocks), which becomes the head of its table. Returns the block ids
        appended to the table, or None, changing nothing, when the pool cannot supply them."""
        if prefix_hit is not None:
            return self._allocate_first(request, num_new_tokens, prefix_hit)
        table = self._tables.setdefault(request.request_id, [])
        self._num_registered_blocks.setdefault(request.request_id, 0)
        self._release_before_window(request, table)
        num_new_blocks = self.num_blocks_for(request.num_computed_tokens + num_new_tokens) - len(table)
        if num_new_blocks <= 0:
            return []
        if num_new_blocks > self.pool.num_free_blocks:
            return None
        added = self.pool.allocate(num_new_blocks)
        table.extend(added)
        return [block.block_id for block in added]

    def _release_before_window(self, request: Request, table: list[KVBlock | None]) -> None:
        """Frees the leading blocks that end before the window of the request's next query (at its computed
        tokens); with prefix caching, only those the cache holds, so they stay prefix hits until evicted."""
        if not self.attention_window:
            return
        first_read = request.num_computed_tokens - self.attention_window + 1
        end = max(first_read, 0) // self.block_size
        if self.enable_prefix_caching:
            end = min(end, self._num_registered_blocks[request.request_id])
        start = self._num_released_blocks.get(request.request_id, 0)
        if end > start:
            self.pool.free([block for block in table[start:end][::-1] if block is not None])
            table[start:end] = [None] * (end - start)
            self._num_released_blocks[request.request_id] = end

    def _allocate_first(self, request: Request, num_new_tokens: int, prefix_hit: PrefixHit) -> list[int] | None:
        if self._tables.get(request.request_id):
            raise ValueError(f"request {request.request_id} already has blocks; pass no prefix hit")
        num_new_blocks = max(self.num_blocks_for(prefix_hit.num_tokens + num_new_tokens) - len(prefix_hit.blocks), 0)
        num_revived = sum(1 for block in prefix_hit.blocks if block.ref_count == 0)
        if num_new_blocks + num_revived > self.pool.num_free_blocks:
            return None
        self.pool.touch(prefix_hit.blocks)
        self._unpin(request.request_id)
        table = self._tables[request.request_id] = prefix_hit.blocks + self.pool.allocate(num_new_blocks)
        self._num_registered_blocks[request.request_id] = len(prefix_hit.blocks)
        if self.enable_prefix_caching:
            self.num_prefix_query_tokens += request.num_tokens
            self.num_prefix_hit_tokens += prefix_hit.num_tokens
        return [block.block_id for block in table]

    def cache_full_blocks(self, request: Request) -> None:
        """Offers the request's full, computed blocks to the prefix cache (incrementally: only the new ones), and
        records each run of blocks the cache took as one stored event."""
        if not self.enable_prefix_caching:
            return
        table = self._tables.get(request.request_id)
        if not table:
            return
        start = self._num_registered_blocks[request.request_id]
        num_known_computed = min(request.num_computed_tokens, request.num_tokens)  # not the tokens still in flight
        end = min(num_known_computed // self.block_size, len(table))
        if end <= start:
            return
        hashes = self._hashes(request)
        run_start = None
        for i in range(start, end):
            if self.pool.cache(table[i], hashes[i]):
                run_start = i if run_start is None else run_start
            elif run_start is not None:
                self._record_stored(request, hashes, run_start, i)
                run_start = None
        if run_start is not None:
            self._record_stored(request, hashes, run_start, end)
        self._num_registered_blocks[request.request_id] = end

    def _record_stored(self, request: Request, hashes: list[BlockHash], first: int, end: int) -> None:
        self.kv_events.stored(BlocksStored(hashes[first:end], hashes[first - 1] if first else None,
                                           request.all_token_ids[first * self.block_size:end * self.block_size]))

    def take_kv_events(self) -> list[KvEvent]:
        """The stored and removed events since the last call, in the order they happened."""
        return self.kv_events.take()

    def free_past_computed(self, request: Request) -> None:
        """Releases the blocks past the request's computed tokens (slots it reserved for proposals it rejected)."""
        table = self._tables.get(request.request_id)
        num_kept = self.num_blocks_for(request.num_computed_tokens)
        if table and len(table) > num_kept:
            self.pool.free(table[num_kept:][::-1])
            del table[num_kept:]

    def free(self, request: Request) -> None:
        """Releases the request's blocks, tail first so a shared prefix outlives its tails in the cache. Idempotent."""
        table = self._tables.pop(request.request_id, None)
        self._unpin(request.request_id)
        self._block_hashes.pop(request.request_id, None)
        self._num_registered_blocks.pop(request.request_id, None)
        self._num_released_blocks.pop(request.request_id, None)
        if table:
            self.pool.free([block for block in table[::-1] if block is not None])

    def hold_prompt_blocks(self, request: Request) -> list[KVBlock]:
        """One more reference on each of the request's full, computed prompt blocks (a prefill leg's lease)."""
        table = self._tables.get(request.request_id, [])
        held = table[:min(request.num_prompt_tokens, request.num_computed_tokens) // self.block_size]
        self.pool.touch(held)
        return held

    def release_held(self, blocks: list[KVBlock]) -> None:
        self.pool.free(blocks[::-1])

    def reserve_pull(self, request: Request, num_remote_blocks: int) -> PullPlan | None:
        """Pins the cached blocks of the request's prompt and fresh blocks for the rest of its leading
        `num_remote_blocks` full blocks (short of its last token, which must be computed), where a decode leg pulls
        them; None, changing nothing, when the pool cannot supply them. The pin ends when the request starts."""
        hit = self.get_computed_blocks(request)
        num_missing = min(num_remote_blocks, (request.num_tokens - 1) // self.block_size) - len(hit.blocks)
        num_revived = sum(1 for block in hit.blocks if block.ref_count == 0)
        if max(num_missing, 0) + num_revived > self.pool.num_free_blocks:
            return None
        self.pool.touch(hit.blocks)
        added = self.pool.allocate(max(num_missing, 0))
        self._pins[request.request_id] = hit.blocks + added
        return PullPlan(len(hit.blocks), [block.block_id for block in added])

    def cache_pulled(self, request: Request) -> None:
        """Offers a decode leg's pulled blocks to the prefix cache, where its start finds them."""
        pinned = self._pins.get(request.request_id, [])
        hashes = self._hashes(request)
        cached = [i for i, block in enumerate(pinned) if self.pool.cache(block, hashes[i])]
        if cached:
            self._record_stored(request, hashes, cached[0], cached[-1] + 1)

    def _unpin(self, request_id: str) -> None:
        pinned = self._pins.pop(request_id, None)
        if pinned:
            self.pool.free(pinned[::-1])

    def unpin(self, request: Request) -> None:
        """Ends a decode leg's pin without starting it (its pull failed, or it was aborted)."""
        self._unpin(request.request_id)
        self._block_hashes.pop(request.request_id, None)

    def fork(self, parent_request_id: str, child_request_id: str, num_computed_tokens: int) -> ForkResult | None:
        """Gives the child the parent's first `num_computed_tokens` of KV (for n > 1 sampling). Full blocks are
        shared by reference; a partial last block is copied into a fresh private block (copy-on-write done at fork
        time, since the child writes into it at its very next step). None if no block is free for that copy, or if
        the parent released a block the child's window reads."""
        parent_table = self._tables[parent_request_id]
        if child_request_id in self._tables:
            raise ValueError(f"request {child_request_id} already has blocks")
        num_full, partial = divmod(num_computed_tokens, self.block_size)
        if self.num_blocks_for(num_computed_tokens) > len(parent_table):
            raise ValueError(f"parent {parent_request_id} holds fewer than {num_computed_tokens} tokens")
        if partial and self.pool.num_free_blocks < 1:
            return None
        num_released = self._num_released_blocks.get(parent_request_id, 0)
        if num_released * self.block_size > num_computed_tokens - self.attention_window + 1:
            return None
        shared = parent_table[:num_full]
        self.pool.touch([block for block in shared if block is not None])
        child_table = shared + (self.pool.allocate(1) if partial else [])
        self._tables[child_request_id] = child_table
        self._num_registered_blocks[child_request_id] = min(num_full, self._num_registered_blocks[parent_request_id])
        self._num_released_blocks[child_request_id] = num_released
        if parent_request_id in self._block_hashes:
            self._block_hashes[child_request_id] = self._block_hashes[parent_request_id][:num_full]
        copies = [(parent_table[num_full].block_id, child_table[-1].block_id)] if partial else []
        return ForkResult(self.block_ids(child_request_id), copies)

    def reset_prefix_cache(self) -> int:
        """Evicts every cached block that no request holds; returns how many."""
        return self.pool.evict_all_cached()

    def _hashes(self, request: Request) -> list[BlockHash]:
        hashes = self._block_hashes.setdefault(request.request_id, [])
        extend_block_hashes(hashes, request.all_token_ids, self.block_size, request.cache_salt, request.images)
        return hashes
