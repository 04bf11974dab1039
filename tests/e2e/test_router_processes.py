"""`sluice serve --router-processes 2`: two router processes listen on the router's port, each takes a share of the
client connections, and the port keeps serving through the other when one is killed."""
import asyncio
import re
import subprocess
import urllib.request

import psutil
import pytest
from grpc_health.v1 import health_pb2

from sluice.cli.bench.grpc_load import run_load
from sluice.cli.bench.workload import random_workload
from sluice.cli.launcher import free_ports, stop_services
from sluice.cli.python_command import sluice_command, sluice_subcommand
from sluice.client import SluiceClient, text_request
from tests.e2e.services import generate_once_served, wait_for_health, wait_for_serve

pytestmark = pytest.mark.slow
SERVING = health_pb2.HealthCheckResponse.SERVING


def _routers(serve: subprocess.Popen) -> list[psutil.Process]:
    children = psutil.Process(serve.pid).children()
    return [child for child in children if sluice_subcommand(child.cmdline()) == "router"]


def _own_address(router: psutil.Process) -> str:
    """The loopback address only this router process listens on, besides the shared port."""
    command = router.cmdline()
    return command[command.index("--listen") + 1].split(",")[1]


def _finished_requests(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    return float(re.search(r"^vllm:e2e_request_latency_seconds_count\{[^}]*\} (\S+)$", text, re.M).group(1))


def test_router_processes_share_the_port(default_model_dir):
    port = free_ports(1)[0]
    metrics_port = free_ports(1, run=4)[0]  # each service serves its metrics on this port + an offset of its own
    address = f"127.0.0.1:{port}"
    serve = subprocess.Popen([*sluice_command(), "serve", "--model", str(default_model_dir),
                              "--port", str(port), "--router-processes", "2", "--metrics-port", str(metrics_port),
                              "--drain-timeout", "2"], stdout=subprocess.PIPE, text=True)
    request = text_request("The capital of France is", max_tokens=6, temperature=0.0)
    try:
        wait_for_serve(serve)
        wait_for_health(address, "sluice.v1.Generation", SERVING, timeout=300)
        routers = _routers(serve)
        assert len(routers) == 2
        answers = []
        for router in routers:
            wait_for_health(_own_address(router), "sluice.v1.Generation", SERVING, timeout=60)
            with SluiceClient(_own_address(router)) as client:
                answers.append(client.generate(request).token_ids)
        assert answers[0] == answers[1] and len(answers[0]) == 6

        # metrics ports: router, scheduler, worker, then the second router
        before = [_finished_requests(metrics_port), _finished_requests(metrics_port + 3)]
        requests = random_workload(16, (8, 16), (4, 4), 49152, 0)
        traces, _ = asyncio.run(run_load(address, requests, connections=16))
        assert [len(trace.token_times) for trace in traces] == [4] * 16
        after = [_finished_requests(metrics_port), _finished_requests(metrics_port + 3)]
        served = [a - b for a, b in zip(after, before)]
        assert sum(served) == 16 and min(served) > 0, served

        routers[0].kill()
        routers[0].wait()
        with SluiceClient(address) as client:
            assert generate_once_served(client, request, timeout=60) == answers[0]
        assert serve.poll() is None
    finally:
        stop_services([serve])
