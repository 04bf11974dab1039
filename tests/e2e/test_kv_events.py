"""SubscribeKvEvents through the real services: the router relays the scheduler's prefix-cache events in smg's
messages, with block hashes that chain, evictions in a small pool, and a cursor to resume from; and the engine's load
on every batch and in load-only batches, which a real smg reads to stop routing to a worker gone silent."""
import json
import queue
import signal
import threading
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2_grpc

from sluice.cli.gateway import GatewayLayout, start_gateway, wait_until_gateway_serves
from sluice.cli.launcher import free_ports
from sluice.client import sampling_params
from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow
BLOCK = 16
NUM_BLOCKS = 12


class Subscription:
    """A SubscribeKvEvents stream read on a thread, its batches queued: those with events (or the call's error) in
    `batches`, the load-only ones in `load_only`."""

    def __init__(self, address: str, start_sequence_number: int = 0, load_records_before_first_batch: bool = False):
        self.channel = grpc.insecure_channel(address)
        stub = vllm_engine_pb2_grpc.VllmEngineStub(self.channel)
        self.call = stub.SubscribeKvEvents(common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start_sequence_number,
            load_records_before_first_batch=load_records_before_first_batch))
        self.batches: queue.Queue = queue.Queue()
        self.load_only: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for batch in self.call:
                (self.load_only if batch.load.load_only else self.batches).put(batch)
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


def test_an_idle_stream_has_heartbeats_and_every_batch_carries_the_load(small_pool):
    subscription = Subscription(small_pool.layout.router_address, load_records_before_first_batch=True)
    try:
        idle = subscription.load_only.get(timeout=3).load  # after the history's replay, if any
        assert idle.running_requests == 0 and not idle.HasField("engine_silence_ms")
        assert idle.max_total_num_tokens == NUM_BLOCKS * BLOCK and idle.engine_reports_steps
        assert subscription.load_only.get(timeout=3).load.sample == idle.sample + 1  # a heartbeat
        while not subscription.batches.empty():  # the replay
            subscription.batches.get()
        _generate(small_pool, _prompt(8000))
        batches = subscription.until(lambda seen: len(_stored_hashes(seen)) >= 3)
        samples = [idle.sample + 1, *(batch.load.sample for batch in batches)]
        assert samples == sorted(set(samples))
        assert any(batch.load.running_requests == 1 for batch in batches)
    finally:
        subscription.close()


@pytest.fixture(scope="module")
def gateway(small_pool, default_model_dir):
    """smg in front of the small pool's router, which it judges wedged after a second without progress."""
    layout = GatewayLayout("127.0.0.1", *free_ports(2))
    process = start_gateway(layout, [small_pool.layout.router_address], default_model_dir,
                            ["--worker-wedge-secs", "1"])
    try:
        wait_until_gateway_serves(layout, 60, process)
        yield layout
    finally:
        process.kill()  # its graceful stop holds the port open 5 s for load balancers, and none balances onto it
        process.wait()


def _gateway_sample(layout: GatewayLayout, name: str, **labels) -> float:
    with urllib.request.urlopen(f"http://{layout.host}:{layout.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def _gateway_load(layout: GatewayLayout) -> dict:
    with urllib.request.urlopen(f"{layout.url}/loads", timeout=5) as response:
        [load] = json.loads(response.read())["loads"]
    return load


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"smg never saw {what}"
        time.sleep(0.1)


def test_smg_takes_the_load_records_and_stops_routing_to_a_silent_worker_until_it_steps_again(small_pool, gateway):
    _wait_for(lambda: _gateway_sample(gateway, "smg_kv_event_batches_total", disposition="load_only"), 5,
              "a load-only batch")
    # GetLoads has no active_token_usage: only a pushed record shows it
    _wait_for(lambda: "active_token_usage" in _gateway_load(gateway), 5, "a pushed load record")
    worker = small_pool.processes[0]
    answers = queue.Queue()
    worker.send_signal(signal.SIGSTOP)
    try:
        body = json.dumps({"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 4}).encode()
        request = urllib.request.Request(f"{gateway.url}/v1/completions", body, {"Content-Type": "application/json"})
        threading.Thread(target=lambda: answers.put(urllib.request.urlopen(request, timeout=60).status),
                         daemon=True).start()
        _wait_for(lambda: _gateway_sample(gateway, "smg_worker_stalled", reason="wedged") == 1, 10,
                  "the worker's silence")
        _wait_for(lambda: _gateway_load(gateway)["num_running_reqs"] == 1, 5, "the request running")
    finally:
        worker.send_signal(signal.SIGCONT)
    assert answers.get(timeout=30) == 200
    _wait_for(lambda: _gateway_sample(gateway, "smg_worker_stalled", reason="wedged") == 0, 10,
              "the worker step again")
