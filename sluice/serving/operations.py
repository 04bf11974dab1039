"""How a service is run: shutdown and drain, metrics, tracing, as the CLI sets them."""
import asyncio
from dataclasses import dataclass, field

from sluice.core.options import option


@dataclass(slots=True)
class Operations:
    """How a service is run: the signal to stop on, how long to drain, where to expose metrics, whether to trace."""

    shutdown: asyncio.Event = field(default_factory=asyncio.Event)  # set on SIGTERM: drain, then exit
    drain_timeout: float = option(30.0, help="seconds in-flight work may take to finish after SIGTERM")
    metrics_port: int | None = option(None, help="serve Prometheus /metrics over HTTP on this port")
    metrics_host: str = option("0.0.0.0", help="the address of --metrics-port")
    tracing: bool = False  # export spans over OTLP; the standard OTEL_* variables configure the exporter

    def __post_init__(self):
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout}")
