"""`sluice serve` starts again a service that exits, and the stack serves again with nobody doing anything."""
import subprocess

import psutil
import pytest
from grpc_health.v1 import health_pb2

from sluice.cli.launcher import free_port, stop_services
from sluice.cli.python_command import sluice_command, sluice_subcommand
from sluice.client import SluiceClient, text_request
from tests.e2e.services import generate_once_served, wait_for_health, wait_for_serve

pytestmark = pytest.mark.slow


def _service_process(serve: subprocess.Popen, name: str) -> psutil.Process:
    """The child of `sluice serve` that runs `python -m sluice.cli <name>`."""
    children = psutil.Process(serve.pid).children()
    return next(child for child in children if sluice_subcommand(child.cmdline()) == name)


def test_serve_restarts_a_killed_worker(default_model_dir):
    address = f"127.0.0.1:{free_port()}"
    serve = subprocess.Popen([*sluice_command(), "serve", "--model", str(default_model_dir),
                              "--port", address.rsplit(":", 1)[1], "--drain-timeout", "2"], stdout=subprocess.PIPE,
                             text=True)
    request = text_request("The capital of France is", max_tokens=6, temperature=0.0)
    try:
        wait_for_serve(serve)
        wait_for_health(address, "sluice.v1.Generation", health_pb2.HealthCheckResponse.SERVING, timeout=300)
        with SluiceClient(address) as client:
            expected = client.generate(request).token_ids
            worker = _service_process(serve, "worker")
            worker.kill()
            worker.wait()
            assert generate_once_served(client, request, timeout=60) == expected
        assert serve.poll() is None
        assert _service_process(serve, "worker").pid != worker.pid
    finally:
        stop_services([serve])
