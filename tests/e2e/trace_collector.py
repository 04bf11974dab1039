"""An OTLP trace collector inside the test process: a gRPC TraceService that keeps every exported span."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class CollectedSpan:
    service: str  # the service.name resource attribute of the process that exported it
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def _attributes(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class TraceCollector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self._lock = threading.Lock()
        self._spans: list[CollectedSpan] = []
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request, context):
        collected = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                collected += [CollectedSpan(service, span.name, span.trace_id.hex(), span.span_id.hex(),
                                            span.parent_span_id.hex(), _attributes(span.attributes))
                              for span in scope_spans.spans]
        with self._lock:
            self._spans += collected
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[CollectedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for_trace(self, trace_id: str, services: set[str], timeout: float = 20.0) -> list[CollectedSpan]:
        """The spans of a trace once every one of `services` has exported some."""
        deadline = time.monotonic() + timeout
        while True:
            spans = [span for span in self.spans() if span.trace_id == trace_id]
            if services <= {span.service for span in spans} or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def wait_for_span(self, matches, timeout: float = 20.0) -> CollectedSpan:
        """The first exported span that `matches`."""
        deadline = time.monotonic() + timeout
        while not (found := [span for span in self.spans() if matches(span)]):
            assert time.monotonic() < deadline, "no such span was exported"
            time.sleep(0.1)
        return found[0]

    def close(self) -> None:
        self._server.stop(0)
