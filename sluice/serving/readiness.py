"""Waiting for a peer service's readiness (grpc.health.v1) before calling it."""
import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.core.errors import Unavailable

_POLL_SECONDS = 0.2
_CHECK_TIMEOUT_SECONDS = 5.0


async def wait_until_serving(channel: grpc.aio.Channel, service: str, timeout: float) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    request = health_pb2.HealthCheckRequest(service=service)
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise Unavailable(f"{service} did not become ready within {timeout:.0f} s")
        try:
            response = await health.Check(request, timeout=min(remaining, _CHECK_TIMEOUT_SECONDS),
                                          wait_for_ready=True)
            if response.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                                    grpc.StatusCode.NOT_FOUND):
                raise
        await asyncio.sleep(_POLL_SECONDS)
