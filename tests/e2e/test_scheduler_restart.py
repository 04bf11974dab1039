"""The router follows its scheduler: UNAVAILABLE and NOT_SERVING while it is gone, serving again once it is back."""
import signal
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sluice.client import text_request
from tests.e2e.services import running_services, wait_for_health

ROUTER_SERVICE = "sluice.v1.Generation"


def test_router_follows_a_killed_and_restarted_scheduler(default_model_dir):
    request = text_request("The capital of France is", max_tokens=4, temperature=0.0)
    with running_services(default_model_dir) as services:
        router = services.layout.router_address
        expected = services.client.generate(request).token_ids
        scheduler = services.processes[1]
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait()
        wait_for_health(router, ROUTER_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        with pytest.raises(grpc.RpcError) as error:
            services.client.generate(request)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE

        services.processes[1] = subprocess.Popen(scheduler.args)
        wait_for_health(router, ROUTER_SERVICE, health_pb2.HealthCheckResponse.SERVING, timeout=120)
        assert services.client.generate(request).token_ids == expected
