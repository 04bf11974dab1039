"""One request as the router sees it: a GenAI span (prompt text is never recorded) and the latency metrics."""
import time
from dataclasses import dataclass

from opentelemetry import trace

from sluice.core.sampling_params import SamplingParams
from sluice.router.schedulers.messages import Event, Finished
from sluice.router.telemetry.metrics import RouterMetrics
from sluice.serving.tracing import carrier_of

_OPERATIONS = {"chat": "chat"}  # every other input is a plain completion


@dataclass(slots=True)
class Timings:
    time_to_first_token_seconds: float
    total_seconds: float


class RouterTelemetry:
    def __init__(self, tracer: trace.Tracer, metrics: RouterMetrics, model_name: str):
        self.tracer = tracer
        self.metrics = metrics
        self.model_name = model_name

    def begin(self, input_kind: str, request_id: str, num_prompt_tokens: int,
              params: SamplingParams) -> "RequestTelemetry":
        """input_kind: which input the request carries ("text", "tokens" or "chat")."""
        operation = _OPERATIONS.get(input_kind, "text_completion")
        span = self.tracer.start_span(f"{operation} {self.model_name}", attributes={
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.top_k": params.top_k,
            "gen_ai.response.id": request_id,
            "gen_ai.usage.input_tokens": num_prompt_tokens,
        })
        return RequestTelemetry(span, self.metrics)


class RequestTelemetry:
    def __init__(self, span: trace.Span, metrics: RouterMetrics):
        self.span = span
        self.metrics = metrics
        self.trace_context = carrier_of(span)  # for the Submit message: the scheduler's spans join this trace
        self._started = time.perf_counter()
        self._first_token_at: float | None = None
        self._last_token_at: float | None = None
        self._ended = False
        self._finished = False
        self._finish_reasons: list[str] = []  # one per sample
        self._num_output_tokens = 0

    def tokens(self, num_tokens: int) -> None:
        now = time.perf_counter()
        if self._first_token_at is None:
            self._first_token_at = now
            time_to_first_token = now - self._started
            self.metrics.time_to_first_token.observe(time_to_first_token)
            self.span.set_attribute("gen_ai.latency.time_to_first_token", time_to_first_token)
        else:
            self.metrics.observe_tokens(num_tokens, now - self._last_token_at)
        self._last_token_at = now

    def timings(self) -> Timings:
        """The request's latencies so far, for the client's Complete message."""
        now = time.perf_counter()
        return Timings((self._first_token_at or now) - self._started, now - self._started)

    def ended(self, ending: Event) -> None:
        """One sample's end (a request with n samples ends n times)."""
        self._ended = True
        if isinstance(ending, Finished):
            self._finished = True
            self._finish_reasons.append(ending.reason.reported)
            self._num_output_tokens += ending.usage.completion_tokens
            self.span.set_attributes({
                "gen_ai.response.finish_reasons": self._finish_reasons,
                "gen_ai.usage.input_tokens": ending.usage.prompt_tokens,
                "gen_ai.usage.output_tokens": self._num_output_tokens,
                "gen_ai.usage.cache_read.input_tokens": ending.usage.cached_tokens,
            })
        else:
            self.span.set_status(trace.StatusCode.ERROR, ending.details)

    def refused(self, error: Exception) -> None:
        """The router could not submit the request (its id is in flight, no scheduler is connected)."""
        self._ended = True
        self.span.set_status(trace.StatusCode.ERROR, str(error))
        self.close()

    def close(self) -> None:
        """Ends the span; a request that finished (not cancelled, rejected or expired) counts in the e2e latency."""
        e2e = time.perf_counter() - self._started
        if self._finished:
            self.metrics.e2e_request_latency.observe(e2e)
        if not self._ended:
            self.span.add_event("cancelled by the client")
        self.span.set_attribute("gen_ai.latency.e2e", e2e)
        self.span.end()

