"""What every Sluice service does around its servicers: health, reflection, admission while ready, drain on
shutdown, error mapping, tracing, metrics and options."""
import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from sluice.serving import tracing
from sluice.serving.admission_gate import AdmissionGate
from sluice.serving.grpc_errors import DomainErrorInterceptor
from sluice.serving.grpc_options import MAX_MESSAGE_BYTES, server_options
from sluice.serving.method_table import MethodTable
from sluice.serving.metrics_endpoint import MetricsEndpoint
from sluice.serving.operations import Operations

_STOP_GRACE_SECONDS = 1.0  # for what is left after a drain: health watches, peers' long-lived streams
_DRAIN_POLL_SECONDS = 0.05

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
T = TypeVar("T")


class Service:
    """A grpc.aio server with health (liveness on "", readiness per service name) and reflection. It listens from
    start(), answering its own methods with UNAVAILABLE until set_ready(True) and again once draining."""

    def __init__(self, service_names: list[str], telemetry_name: str, operations: Operations,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
                 credentials: grpc.ServerCredentials | None = None,
                 max_receive_message_bytes: int = MAX_MESSAGE_BYTES, share_port: bool = False):
        self.service_names = service_names
        self.operations = operations
        self.gate = AdmissionGate()
        self.tracer_provider = tracing.build_tracer_provider(telemetry_name) if operations.tracing else None
        self.tracer = tracing.tracer_of(self.tracer_provider)
        self.metrics_registry = CollectorRegistry()
        traced = [tracing.server_interceptor(self.tracer_provider)] if self.tracer_provider else []
        self.server = grpc.aio.server(interceptors=[self.gate, *interceptors, *traced, DomainErrorInterceptor()],
                                      options=server_options(max_receive_message_bytes, share_port))
        self.methods = MethodTable()
        self.server.add_generic_rpc_handlers([self.methods])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME],
                                            self.server)
        self._credentials = credentials
        self._metrics_endpoint: MetricsEndpoint | None = None

    def add(self, add_to_server: Callable, servicer) -> None:
        add_to_server(servicer, self.methods)

    async def start(self, *addresses: str) -> int:
        """Listens on every address; returns the first one's port."""
        ports = [self._bind(address) for address in addresses]
        await self.server.start()
        await self.health.set("", SERVING)
        await self.set_ready(False)
        if self.operations.metrics_port is not None:
            self._metrics_endpoint = MetricsEndpoint(self.metrics_registry, self.operations.metrics_host,
                                                     self.operations.metrics_port)
        return ports[0]

    def _bind(self, address: str) -> int:
        if self._credentials is None:
            port = self.server.add_insecure_port(address)
        else:
            port = self.server.add_secure_port(address, self._credentials)
        if port == 0:
            raise RuntimeError(f"cannot bind {address}")
        return port

    async def set_ready(self, ready: bool) -> None:
        """Readiness and admission of the service's own methods; once the shutdown signal has come, neither."""
        self.gate.open = ready and not self.operations.shutdown.is_set()
        await self.report_ready(ready)

    async def report_ready(self, ready: bool) -> None:
        """Readiness alone: a service that lost a peer reports NOT_SERVING but still answers its methods, refusing
        only the work it cannot do. Once the shutdown signal has come, never SERVING."""
        ready = ready and not self.operations.shutdown.is_set()
        for name in self.service_names:
            await self.health.set(name, SERVING if ready else NOT_SERVING)

    async def wait_for_shutdown(self, *watched: asyncio.Future) -> None:
        """Returns on the shutdown signal; raises if a watched task fails first."""
        signal = asyncio.ensure_future(self.operations.shutdown.wait())
        done, _ = await asyncio.wait([signal, *watched], return_when=asyncio.FIRST_COMPLETED)
        signal.cancel()
        for task in watched:
            if task in done:
                task.result()

    async def unless_shutdown(self, awaitable: Awaitable[T]) -> T | None:
        """The awaitable's result; None, the awaitable cancelled, if the shutdown signal comes first (a service still
        waiting for its peers has nothing to drain)."""
        work = asyncio.ensure_future(awaitable)
        signal = asyncio.ensure_future(self.operations.shutdown.wait())
        try:
            await asyncio.wait([work, signal], return_when=asyncio.FIRST_COMPLETED)
        finally:
            signal.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return None

    async def drain(self, is_idle: Callable[[], bool] | None = None) -> bool:
        """Readiness goes NOT_SERVING and new calls get UNAVAILABLE; waits until is_idle() (default: no call of
        this service's own in flight) or the drain timeout. True if the service drained in time."""
        await self.set_ready(False)
        is_idle = is_idle or (lambda: self.gate.num_in_flight == 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.operations.drain_timeout
        while not is_idle() and loop.time() < deadline:
            await asyncio.sleep(_DRAIN_POLL_SECONDS)
        return is_idle()

    async def close(self) -> None:
        await self.set_ready(False)
        await self.server.stop(_STOP_GRACE_SECONDS)
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()
        await asyncio.to_thread(tracing.shutdown, self.tracer_provider)

    async def __aenter__(self) -> "Service":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
