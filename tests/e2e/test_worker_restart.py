"""The scheduler outlives its worker: the streams end with UNAVAILABLE, the scheduler stays up, NOT_SERVING with every
KV block free, and serves again once the worker is back at the same address."""
import signal
import subprocess
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sluice.client import SluiceClient, text_request
from tests.e2e.services import running_services, stream_to_its_end, wait_for_health

pytestmark = pytest.mark.slow

SCHEDULER_SERVICE = "sluice.v1.Scheduler"
NUM_STREAMS = 3


def _stream(address: str, started: threading.Semaphore, codes: list) -> None:
    request = text_request("Tell me a very long story.", max_tokens=1000, temperature=0.0, ignore_eos=True)
    with SluiceClient(address) as client:
        stream_to_its_end(client, request, started, codes)


def test_scheduler_outlives_a_killed_worker_and_serves_it_again(default_model_dir):
    short = text_request("The capital of France is", max_tokens=6, temperature=0.0)
    with running_services(default_model_dir) as services:
        scheduler = services.layout.scheduler_address
        expected = services.client.generate(short).token_ids
        num_blocks = services.load().num_total_blocks
        started, codes = threading.Semaphore(0), []
        streams = [threading.Thread(target=_stream, args=(services.layout.router_address, started, codes))
                   for _ in range(NUM_STREAMS)]
        for stream in streams:
            stream.start()
        for _ in streams:
            assert started.acquire(timeout=60)

        worker = services.processes[0]
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        killed = time.monotonic()
        for stream in streams:
            stream.join(timeout=10)
        assert codes == [grpc.StatusCode.UNAVAILABLE] * NUM_STREAMS
        assert time.monotonic() - killed < 10
        wait_for_health(scheduler, SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING, timeout=5)
        assert services.processes[1].poll() is None
        load = services.load()
        assert (load.num_running, load.num_waiting, load.num_free_blocks) == (0, 0, num_blocks)
        with pytest.raises(grpc.RpcError) as error:
            services.client.generate(short)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE

        services.processes[0] = subprocess.Popen(worker.args, env=services.env)
        wait_for_health(scheduler, SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING, timeout=60)
        assert services.client.generate(short).token_ids == expected
        assert services.load().num_free_blocks == num_blocks
