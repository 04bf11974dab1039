"""Services that share a port (router processes under `sluice serve --router-processes`) both start on it and each
answers on an address of its own; a service that does not share its port refuses to start on a taken one."""
import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.cli.launcher import free_ports
from sluice.serving.operations import Operations
from sluice.serving.service import Service


async def _liveness(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service="")
        return (await health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)).status


def test_services_that_share_a_port_both_listen_on_it():
    shared, own_a, own_b = (f"127.0.0.1:{port}" for port in free_ports(3))

    async def scenario():
        async with Service(["a"], "a", Operations(), share_port=True) as first, \
                Service(["b"], "b", Operations(), share_port=True) as second:
            assert await first.start(shared, own_a) == int(shared.rsplit(":", 1)[1])
            await second.start(shared, own_b)
            for address in (shared, own_a, own_b):
                assert await _liveness(address) == health_pb2.HealthCheckResponse.SERVING

    asyncio.run(scenario())


def test_a_taken_port_is_refused_without_sharing():
    address = f"127.0.0.1:{free_ports(1)[0]}"

    async def scenario():
        async with Service(["a"], "a", Operations()) as first, Service(["b"], "b", Operations()) as second:
            await first.start(address)
            with pytest.raises(RuntimeError, match="(?i)bind"):
                await second.start(address)

    asyncio.run(scenario())
