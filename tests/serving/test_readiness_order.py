"""Services listen before they can serve: health answers NOT_SERVING while the worker loads its model and while the
scheduler waits for its worker."""
import asyncio
import threading
from types import SimpleNamespace

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.cli.launcher import free_port, free_ports
from sluice.serving.operations import Operations

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _wait_for_status(address: str, service: str, status: int, timeout: float = 30.0) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                request = health_pb2.HealthCheckRequest(service=service)
                if (await health.Check(request, timeout=1, wait_for_ready=True)).status == status:
                    return
            except grpc.aio.AioRpcError:
                pass
            assert loop.time() < deadline, f"{service} never reported {status}"
            await asyncio.sleep(0.05)


def test_worker_is_not_serving_while_its_model_loads(monkeypatch):
    from sluice.worker import server
    from sluice.worker.config import WorkerConfig

    loaded = threading.Event()

    def slow_load(config, group=None):
        assert loaded.wait(30)
        return SimpleNamespace(num_live_requests=0, device=torch.device("cpu"))  # no step reaches it; the drain asks

    monkeypatch.setattr(server.WorkerEngine, "load", slow_load)
    address = f"127.0.0.1:{free_port()}"

    async def scenario():
        operations = Operations(drain_timeout=1.0)
        serving = asyncio.create_task(server.serve(WorkerConfig(model="unused"), address, operations))
        await _wait_for_status(address, "", SERVING)
        await _wait_for_status(address, "sluice.v1.Worker", NOT_SERVING)
        loaded.set()
        await _wait_for_status(address, "sluice.v1.Worker", SERVING)
        operations.shutdown.set()
        await asyncio.wait_for(serving, 10)

    asyncio.run(scenario())


def test_scheduler_is_not_ready_until_its_worker_is():
    from sluice.scheduler import server

    address, absent_worker = (f"127.0.0.1:{port}" for port in free_ports(2))

    async def scenario():
        serving = asyncio.create_task(server.serve([absent_worker], address, Operations(), worker_timeout=30))
        await _wait_for_status(address, "", SERVING)
        await _wait_for_status(address, "sluice.v1.Scheduler", NOT_SERVING)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    asyncio.run(scenario())
