import asyncio
from dataclasses import dataclass, field


@dataclass(slots=True)
class Operations:
    """How a service is run: the signal to stop on, how long to drain, where to expose metrics, whether to trace."""

    shutdown: asyncio.Event = field(default_factory=asyncio.Event)  # set on SIGTERM: drain, then exit
    drain_timeout: float = 30.0  # seconds in-flight work may take to finish after shutdown
    metrics_port: int | None = None  # HTTP /metrics (Prometheus) on this port when set
    metrics_host: str = "0.0.0.0"
    tracing: bool = False  # export spans over OTLP; the standard OTEL_* variables configure the exporter

    def __post_init__(self):
        if self.drain_timeout < 0:
            raise ValueError(f"drain_timeout must be >= 0, got {self.drain_timeout}")
