"""`sluice serve` under load, on SIGTERM: the router drains first while the scheduler and the worker still serve, so
every stream in flight ends with all its tokens; then the scheduler stops, then the worker, serve exits 0, and none
of its processes is left."""
import signal
import subprocess
import threading
import time

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.cli.launcher import free_port, stop_services
from sluice.cli.python_command import sluice_command, sluice_subcommand
from sluice.client import SluiceClient, text_request
from tests.e2e.services import wait_for_serve

pytestmark = pytest.mark.slow

DRAIN_TIMEOUT = 30.0
NUM_STREAMS = 6
MAX_TOKENS = 48
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
READINESS = {"scheduler": "sluice.v1.Scheduler", "worker": "sluice.v1.Worker"}


def _stream(address: str, started: threading.Semaphore, ends: list) -> None:
    """Appends (when the stream ended, its completion tokens)."""
    request = text_request("Tell me about the history of bridges.", max_tokens=MAX_TOKENS, temperature=0.0,
                           ignore_eos=True)
    with SluiceClient(address) as client:
        stream = client.stream(request)
        next(stream)
        started.release()
        for response in stream:
            if response.HasField("complete"):
                ends.append((time.monotonic(), response.complete.usage.completion_tokens))


def _watch_readiness(address: str, service: str, changes: list) -> None:
    """Appends (when, status) for each readiness status the service reports, until it stops."""
    with grpc.insecure_channel(address) as channel:
        try:
            for response in health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service)):
                changes.append((time.monotonic(), response.status))
        except grpc.RpcError:
            pass


def _listen_address(serve: subprocess.Popen, name: str) -> str:
    """The --listen of the child of `sluice serve` that runs the service `name`."""
    command = next(child.cmdline() for child in psutil.Process(serve.pid).children()
                   if sluice_subcommand(child.cmdline()) == name)
    return command[command.index("--listen") + 1]


def _not_serving_since(changes: list) -> float:
    return next(when for when, status in changes if status == NOT_SERVING)


def test_sigterm_lets_every_stream_finish_then_stops_scheduler_and_worker_in_turn(default_model_dir):
    address = f"127.0.0.1:{free_port()}"
    serve = subprocess.Popen([*sluice_command(), "serve", "--model", str(default_model_dir),
                              "--port", address.rsplit(":", 1)[1], "--drain-timeout", str(DRAIN_TIMEOUT)],
                             stdout=subprocess.PIPE, text=True)
    try:
        wait_for_serve(serve)
        descendants = psutil.Process(serve.pid).children(recursive=True)
        readiness = {name: [] for name in READINESS}
        watches = [threading.Thread(target=_watch_readiness, args=(_listen_address(serve, name), service,
                                                                   readiness[name]))
                   for name, service in READINESS.items()]
        started, ends = threading.Semaphore(0), []
        streams = [threading.Thread(target=_stream, args=(address, started, ends)) for _ in range(NUM_STREAMS)]
        for thread in [*watches, *streams]:
            thread.start()
        for _ in streams:
            assert started.acquire(timeout=60)

        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=3 * DRAIN_TIMEOUT) == 0
        for thread in [*streams, *watches]:
            thread.join(timeout=5)
        assert [tokens for _, tokens in ends] == [MAX_TOKENS] * NUM_STREAMS
        last_stream_end = max(when for when, _ in ends)
        assert last_stream_end < _not_serving_since(readiness["scheduler"]) < _not_serving_since(readiness["worker"])
        _, left = psutil.wait_procs(descendants, timeout=5)
        assert left == []
    finally:
        stop_services([serve])
