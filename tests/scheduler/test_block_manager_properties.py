"""Stateful property test of the BlockManager against a model that tracks, per physical block, the token whose KV
each slot holds; with full attention, and with a sliding window that releases the blocks before it."""
from collections import Counter

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sluice.core.sampling_params import SamplingParams
from sluice.scheduler.kv_cache.block_manager import RELEASED_BLOCK_ID, BlockManager
from sluice.scheduler.request import Request

BLOCK_SIZE = 2
NUM_BLOCKS = 12
TOKENS = st.integers(1, 2)  # a tiny alphabet, so prefixes collide often
SALTS = st.sampled_from([None, None, "tenant"])


class BlockManagerMachine(RuleBasedStateMachine):
    attention_window = 0

    def __init__(self):
        super().__init__()
        self.manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True,
                                    attention_window=self.attention_window)
        self.requests: dict[str, Request] = {}
        self.tables: dict[str, list[int | None]] = {}  # the model's copy of every block table; None: released
        self.kv: dict[int, list[int | None]] = {}  # block id -> token written in each slot
        self.next_id = 0

    def _compute(self, request: Request, num_tokens: int) -> None:
        table = self.tables[request.request_id]
        for pos in range(request.num_computed_tokens, request.num_computed_tokens + num_tokens):
            block = table[pos // BLOCK_SIZE]
            assert self.manager.pool.blocks[block].ref_count == 1, "a shared block was written in place"
            self.kv.setdefault(block, [None] * BLOCK_SIZE)[pos % BLOCK_SIZE] = request.all_token_ids[pos]
        request.num_computed_tokens += num_tokens
        self.manager.cache_full_blocks(request)

    def _new_id(self) -> str:
        self.next_id += 1
        return f"r{self.next_id}"

    @rule(prompt=st.lists(TOKENS, min_size=1, max_size=12), salt=SALTS, data=st.data())
    def add(self, prompt, salt, data):
        request = Request(self._new_id(), prompt, SamplingParams(), cache_salt=salt)
        hit = self.manager.get_computed_blocks(request)
        assert hit.num_tokens == len(hit.blocks) * BLOCK_SIZE < request.num_tokens
        for pos in range(hit.num_tokens):
            assert self.kv[hit.blocks[pos // BLOCK_SIZE].block_id][pos % BLOCK_SIZE] == prompt[pos], \
                "a cache hit returned a block holding other tokens"
        num_new = data.draw(st.integers(1, request.num_tokens - hit.num_tokens))
        num_free = self.manager.num_free_blocks
        num_revived = sum(1 for block in hit.blocks if block.ref_count == 0)
        needed = -(-(hit.num_tokens + num_new) // BLOCK_SIZE) - len(hit.blocks) + num_revived
        block_ids = self.manager.allocate_slots(request, num_new, hit)
        if block_ids is None:
            assert needed > num_free
            assert self.manager.num_free_blocks == num_free and not self.manager.block_ids(request.request_id)
            return
        assert block_ids[:len(hit.blocks)] == [block.block_id for block in hit.blocks]
        self.requests[request.request_id] = request
        self.tables[request.request_id] = list(block_ids)
        request.num_computed_tokens = hit.num_tokens
        self._compute(request, num_new)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), token=TOKENS)
    def append(self, data, token):
        request = self.requests[data.draw(st.sampled_from(sorted(self.requests)))]
        if request.num_tokens_to_compute == 0:
            request.append_output_token(token)  # "sampled" after the last computed token
        num_new = data.draw(st.integers(1, request.num_tokens_to_compute))
        num_free = self.manager.num_free_blocks
        new_ids = self.manager.allocate_slots(request, num_new)
        self._take_releases(request)
        if new_ids is None:  # nothing taken; a window may have released blocks
            assert self.manager.num_free_blocks >= num_free if self.attention_window else \
                self.manager.num_free_blocks == num_free
            return
        self.tables[request.request_id] += new_ids
        self._compute(request, num_new)

    def _take_releases(self, request: Request) -> None:
        """With a window, each allocation releases the blocks that end before the next query's window."""
        if self.attention_window:
            table = self.tables[request.request_id]
            num_released = max(request.num_computed_tokens - self.attention_window + 1, 0) // BLOCK_SIZE
            table[:num_released] = [None] * min(num_released, len(table))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def fork(self, data):
        parent = self.requests[data.draw(st.sampled_from(sorted(self.requests)))]
        child = Request(self._new_id(), list(parent.all_token_ids), SamplingParams(), cache_salt=parent.cache_salt)
        num_computed = data.draw(st.integers(max(parent.num_computed_tokens - 2, 0), parent.num_computed_tokens))
        result = self.manager.fork(parent.request_id, child.request_id, num_computed)
        if result is None:
            return
        for source, destination in result.copies:
            self.kv[destination] = list(self.kv[source])
        child.num_computed_tokens = num_computed
        self.requests[child.request_id] = child
        self.tables[child.request_id] = [None if parent_block is None else block_id for parent_block, block_id
                                         in zip(self.tables[parent.request_id] + [-1], result.block_ids)]
        self.manager.cache_full_blocks(child)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free(self, data):
        request_id = data.draw(st.sampled_from(sorted(self.requests)))
        self.manager.free(self.requests.pop(request_id))
        self.manager.free(Request(request_id, [1], SamplingParams()))  # idempotent
        del self.tables[request_id]

    @rule()
    def evict_cached(self):
        self.manager.reset_prefix_cache()

    @invariant()
    def tables_match_the_model(self):
        for request_id, table in self.tables.items():
            assert self.manager.block_ids(request_id) == [RELEASED_BLOCK_ID if block is None else block
                                                          for block in table]

    @invariant()
    def windows_hold_their_tokens(self):
        for request_id, table in self.tables.items():
            request = self.requests[request_id]
            first_read = max(request.num_computed_tokens - self.attention_window + 1, 0) if self.attention_window \
                else 0
            for pos in range(first_read, request.num_computed_tokens):
                assert table[pos // BLOCK_SIZE] is not None, "a block the window reads was released"
                assert self.kv[table[pos // BLOCK_SIZE]][pos % BLOCK_SIZE] == request.all_token_ids[pos]

    @invariant()
    def ref_counts_equal_table_membership(self):
        holders = Counter(block for table in self.tables.values() for block in table if block is not None)
        for block in self.manager.pool.blocks:
            assert block.ref_count == holders[block.block_id] >= 0
        num_used = sum(1 for block in self.manager.pool.blocks if block.ref_count > 0)
        assert self.manager.num_free_blocks + num_used == NUM_BLOCKS
        assert self.manager.num_used_blocks == num_used

    @invariant()
    def only_full_blocks_are_shared_or_cached(self):
        for request_id, table in self.tables.items():
            request = self.requests[request_id]
            for index, block_id in enumerate(table):
                if block_id is None:
                    continue
                block = self.manager.pool.blocks[block_id]
                if block.ref_count >= 2 or block.block_hash is not None:
                    assert (index + 1) * BLOCK_SIZE <= request.num_computed_tokens
        for block in self.manager.pool.blocks:
            if block.block_hash is not None:
                assert self.manager.pool.lookup(block.block_hash) is block
                assert None not in self.kv[block.block_id]


class WindowedBlockManagerMachine(BlockManagerMachine):
    attention_window = 3


for machine in (BlockManagerMachine, WindowedBlockManagerMachine):
    machine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
TestBlockManager = BlockManagerMachine.TestCase
TestWindowedBlockManager = WindowedBlockManagerMachine.TestCase
