"""SubscribeKvEvents through the real services: the router relays the scheduler's prefix-cache events in smg's
messages, with block hashes that chain, evictions in a small pool, and a cursor to resume from."""
import queue
import threading

import grpc
import pytest
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2_grpc

from sluice.client import sampling_params
from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow
BLOCK = 16
NUM_BLOCKS = 12


class Subscription:
    """A SubscribeKvEvents stream read on a thread, its batches queued."""

    def __init__(self, address: str, start_sequence_number: int = 0):
        self.channel = grpc.insecure_channel(address)
        stub = vllm_engine_pb2_grpc.VllmEngineStub(self.channel)
        self.call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start_sequence_number))
        self.batches: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for batch in self.call:
                self.batches.put(batch)
        except grpc.RpcError as error:
            self.batches.put(error)

    def until(self, done, timeout: float = 10.0) -> list:
        """Batches until done(batches) holds."""
        batches = []
        while not done(batches):
            batch = self.batches.get(timeout=timeout)
            assert not isinstance(batch, grpc.RpcError), batch
            batches.append(batch)
        return batches

    def close(self):
        self.call.cancel()
        self.channel.close()


@pytest.fixture(scope="module")
def small_pool(default_model_dir):
    with running_services(default_model_dir, ["--num-blocks", str(NUM_BLOCKS), "--block-size", str(BLOCK)]) as running:
        yield running


def _generate(services, prompt: list[int]):
    request = pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt), sampling=sampling_params(max_tokens=2,
                                                                                         ignore_eos=True))
    services.client.generate(request)


def _prompt(first_token: int) -> list[int]:
    return list(range(first_token, first_token + 3 * BLOCK))  # three full blocks; the output starts a fourth


def _stored(batches) -> list:
    return [event.stored for batch in batches for event in batch.events if event.HasField("stored")]


def _removed_hashes(batches) -> set[int]:
    return {h for batch in batches for event in batch.events if event.HasField("removed")
            for h in event.removed.block_hashes}


def _stored_hashes(batches) -> list[int]:
    return [block.block_hash for stored in _stored(batches) for block in stored.blocks]


def test_a_prompt_stores_its_blocks_in_a_chain_and_eviction_removes_them(small_pool):
    subscription = Subscription(small_pool.layout.router_address)
    try:
        prompt = _prompt(1000)
        _generate(small_pool, prompt)
        batches = subscription.until(lambda seen: len(_stored_hashes(seen)) >= 3)
        stored = _stored(batches)
        blocks = [block for event in stored for block in event.blocks]
        assert [list(block.token_ids) for block in blocks] == [prompt[i:i + BLOCK] for i in range(0, 48, BLOCK)]
        assert {block.block_size for block in blocks} == {BLOCK}
        assert not stored[0].HasField("parent_block_hash")
        for event, before in zip(stored[1:], stored):
            assert event.parent_block_hash == before.blocks[-1].block_hash
        sequence_numbers = [batch.sequence_number for batch in batches]
        assert sequence_numbers == list(range(sequence_numbers[0], sequence_numbers[0] + len(batches)))
        first_hashes = {block.block_hash for block in blocks}
        for k in range(1, 5):  # each caches three more blocks: the fourth finds the 12-block pool full of them
            _generate(small_pool, _prompt(1000 + 100 * k))
        subscription.until(lambda seen: first_hashes <= _removed_hashes(seen))
        assert small_pool.wait_until_idle().num_free_blocks == NUM_BLOCKS
    finally:
        subscription.close()


def test_a_subscriber_resumes_after_the_last_batch_it_has(small_pool):
    first = Subscription(small_pool.layout.router_address)
    try:
        _generate(small_pool, _prompt(5000))
        last = first.until(lambda seen: _stored_hashes(seen) and not first.batches.qsize())[-1].sequence_number
    finally:
        first.close()
    prompt = _prompt(6000)
    _generate(small_pool, prompt)
    resumed = Subscription(small_pool.layout.router_address, start_sequence_number=last)
    try:
        batches = resumed.until(lambda seen: any(b.token_ids[0] == prompt[0] for b in
                                                 (block for s in _stored(seen) for block in s.blocks)))
        assert batches[0].sequence_number == last + 1
        assert all(block.token_ids[0] != 5000 for s in _stored(batches) for block in s.blocks)
    finally:
        resumed.close()


def test_a_cursor_past_the_history_is_out_of_range_and_the_router_stays_healthy(small_pool):
    subscription = Subscription(small_pool.layout.router_address, start_sequence_number=10**9)
    try:
        error = subscription.batches.get(timeout=10)
        assert isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "restarted" in error.details()
    finally:
        subscription.close()
    _generate(small_pool, _prompt(7000))
