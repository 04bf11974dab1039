"""OpenTelemetry tracing of one service: an OTLP exporter configured by the standard OTEL_* variables, the gRPC
server interceptor (health checks and reflection are not traced), and W3C trace context carried inside messages."""
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.instrumentation.grpc.filters import any_of, full_method_name, negate, service_name
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from sluice.serving.rpc_handlers import OPERATIONS_METHODS, OPERATIONS_SERVICES

TRACER_NAME = "sluice"
_FLUSH_TIMEOUT_MILLIS = 3000
_PROPAGATOR = TraceContextTextMapPropagator()


def build_tracer_provider(service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def tracer_of(provider: TracerProvider | None) -> trace.Tracer:
    return trace.NoOpTracer() if provider is None else provider.get_tracer(TRACER_NAME)


def server_interceptor(provider: TracerProvider):
    untraced = any_of(*(service_name(name) for name in OPERATIONS_SERVICES),
                      *(full_method_name(name) for name in OPERATIONS_METHODS))
    return aio_server_interceptor(tracer_provider=provider, filter_=negate(untraced))


def shutdown(provider: TracerProvider | None) -> None:
    if provider is not None:
        provider.force_flush(_FLUSH_TIMEOUT_MILLIS)
        provider.shutdown()


def carrier_of(span: trace.Span) -> dict[str, str]:
    """The W3C traceparent (and tracestate) of a span, for a message field; empty for a span that is not recorded."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def context_of(carrier) -> Context:
    return _PROPAGATOR.extract(dict(carrier))
