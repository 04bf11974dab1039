"""The scheduler outlives its worker, whether it exits or hangs (a stopped process: only the step timeout notices):
the streams end with UNAVAILABLE, the scheduler stays up, NOT_SERVING with every KV block free, the router follows
it to NOT_SERVING (its vLLM HealthCheck too) and refuses new requests at once, and both serve again once the worker
is back: restarted at the same address, or woken up."""
import signal
import subprocess
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from sluice.client import SluiceClient, text_request
from tests.e2e.services import running_services, stream_to_its_end, wait_for_health

pytestmark = pytest.mark.slow

SCHEDULER_SERVICE = "sluice.v1.Scheduler"
ROUTER_SERVICE = "sluice.v1.Generation"
NUM_STREAMS = 3
STEP_TIMEOUT = 3.0
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SHORT = text_request("The capital of France is", max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def stack(default_model_dir):
    with running_services(default_model_dir, ["--step-timeout", str(STEP_TIMEOUT)]) as services:
        services.expected = services.client.generate(SHORT).token_ids
        services.num_blocks = services.load().num_total_blocks
        yield services


def _stream(address: str, started: threading.Semaphore, codes: list) -> None:
    request = text_request("Tell me a very long story.", max_tokens=1000, temperature=0.0, ignore_eos=True)
    with SluiceClient(address) as client:
        stream_to_its_end(client, request, started, codes)


def _start_streams(stack) -> tuple[list[threading.Thread], list]:
    started, codes = threading.Semaphore(0), []
    streams = [threading.Thread(target=_stream, args=(stack.layout.router_address, started, codes))
               for _ in range(NUM_STREAMS)]
    for stream in streams:
        stream.start()
    for _ in streams:
        assert started.acquire(timeout=60)
    return streams, codes


def _assert_lost_and_refusing(stack) -> None:
    """Within 2 s of the streams' end: the scheduler and the router NOT_SERVING, the blocks free, a new request
    refused within 1 s."""
    wait_for_health(stack.layout.scheduler_address, SCHEDULER_SERVICE, NOT_SERVING, timeout=2)
    wait_for_health(stack.layout.router_address, ROUTER_SERVICE, NOT_SERVING, timeout=2)
    with grpc.insecure_channel(stack.layout.router_address) as channel:
        engine = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        assert not engine.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=2).healthy
        with pytest.raises(grpc.RpcError) as error:
            engine.GetLoads(vllm_engine_pb2.GetLoadsRequest(), timeout=2)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert stack.processes[1].poll() is None
    load = stack.load()
    assert (load.num_running, load.num_waiting, load.num_free_blocks) == (0, 0, stack.num_blocks)
    asked = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        stack.client.generate(SHORT, timeout=30)
    assert error.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - asked < 1.0


def _assert_serving_again(stack, timeout: float) -> None:
    wait_for_health(stack.layout.scheduler_address, SCHEDULER_SERVICE, SERVING, timeout=timeout)
    wait_for_health(stack.layout.router_address, ROUTER_SERVICE, SERVING, timeout=5)
    assert stack.client.generate(SHORT).token_ids == stack.expected
    assert stack.wait_until_idle().num_free_blocks == stack.num_blocks


def test_scheduler_outlives_a_killed_worker_and_serves_it_again(stack):
    streams, codes = _start_streams(stack)
    worker = stack.processes[0]
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    killed = time.monotonic()
    for stream in streams:
        stream.join(timeout=10)
    assert codes == [grpc.StatusCode.UNAVAILABLE] * NUM_STREAMS
    assert time.monotonic() - killed < 10
    _assert_lost_and_refusing(stack)

    stack.processes[0] = subprocess.Popen(worker.args, env=stack.env)
    _assert_serving_again(stack, timeout=60)


def test_a_stopped_worker_is_lost_after_the_step_timeout_and_taken_back_once_woken(stack):
    streams, codes = _start_streams(stack)
    worker = stack.processes[0]
    worker.send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        for stream in streams:
            stream.join(timeout=2 * STEP_TIMEOUT + 5)
        assert codes == [grpc.StatusCode.UNAVAILABLE] * NUM_STREAMS
        assert time.monotonic() - stopped < STEP_TIMEOUT * 1.1 + 1.0  # a decode step's bound, plus 1 s
        _assert_lost_and_refusing(stack)
    finally:
        worker.send_signal(signal.SIGCONT)
    _assert_serving_again(stack, timeout=30)
    assert worker.poll() is None  # the same process, set up again
