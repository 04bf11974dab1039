"""One SIGTERM (all that Kubernetes sends) stops a service that still waits for its peer, well within the drain
timeout."""
import signal
import subprocess

import pytest
from grpc_health.v1 import health_pb2

from sluice.cli.launcher import free_ports, stop_services
from sluice.cli.python_command import sluice_command
from tests.e2e.services import health_status, wait_for_health

pytestmark = pytest.mark.slow

DRAIN_TIMEOUT = 2.0


@pytest.mark.parametrize("service, waits_with", [
    ("sluice.v1.Scheduler", ["scheduler", "--worker"]),
    ("sluice.v1.Generation", ["router", "--no-tokenizer", "--scheduler"]),
])
def test_one_sigterm_stops_a_service_waiting_for_its_peer(service, waits_with):
    address, absent_peer = (f"127.0.0.1:{port}" for port in free_ports(2))
    process = subprocess.Popen([*sluice_command(), *waits_with, absent_peer, "--listen", address,
                                "--drain-timeout", str(DRAIN_TIMEOUT)])
    try:
        wait_for_health(address, "", health_pb2.HealthCheckResponse.SERVING, timeout=60)
        assert health_status(address, service) == health_pb2.HealthCheckResponse.NOT_SERVING
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=3 * DRAIN_TIMEOUT) == 0  # the interpreter's exit takes seconds on a busy machine
    finally:
        stop_services([process])
