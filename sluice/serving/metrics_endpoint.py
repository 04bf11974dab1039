"""A service's Prometheus registry served over HTTP at /metrics."""
from prometheus_client import CollectorRegistry, start_http_server


class MetricsEndpoint:
    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
