"""The router follows its scheduler: UNAVAILABLE and NOT_SERVING while it is gone, serving again once it is back."""
import signal
import subprocess
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.client import text_request
from tests.e2e.services import running_services

ROUTER_SERVICE = "sluice.v1.Generation"


def _router_status(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=ROUTER_SERVICE)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=2).status


def _wait_for_status(address: str, status: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _router_status(address) != status:
        assert time.monotonic() < deadline, f"router never reached status {status}"
        time.sleep(0.1)


def test_router_follows_a_killed_and_restarted_scheduler(default_model_dir):
    request = text_request("The capital of France is", max_tokens=4, temperature=0.0)
    with running_services(default_model_dir) as services:
        router = services.layout.router_address
        expected = services.client.generate(request).token_ids
        scheduler = services.processes[1]
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait()
        _wait_for_status(router, health_pb2.HealthCheckResponse.NOT_SERVING)
        with pytest.raises(grpc.RpcError) as error:
            services.client.generate(request)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE

        services.processes[1] = subprocess.Popen(scheduler.args)
        _wait_for_status(router, health_pb2.HealthCheckResponse.SERVING, timeout=120)
        assert services.client.generate(request).token_ids == expected
