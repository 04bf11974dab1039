"""What every Sluice service does around its servicers: health, reflection, error mapping, options, shutdown."""
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sluice.grpc_errors import DomainErrorInterceptor
from sluice.grpc_options import SERVER_OPTIONS


class Service:
    """A grpc.aio server with health (liveness on "", readiness per service name) and reflection."""

    def __init__(self, service_names: list[str]):
        self.service_names = service_names
        self.server = grpc.aio.server(interceptors=[DomainErrorInterceptor()], options=SERVER_OPTIONS)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                                            self.server)

    def add(self, add_to_server: Callable, servicer) -> None:
        add_to_server(servicer, self.server)

    async def start(self, address: str) -> int:
        port = self.server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError(f"cannot bind {address}")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.set_ready(False)
        return port

    async def set_ready(self, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in self.service_names:
            await self.health.set(name, status)

    async def wait(self) -> None:
        await self.server.wait_for_termination()

    async def stop(self, grace: float) -> None:
        await self.set_ready(False)
        await self.server.stop(grace)
