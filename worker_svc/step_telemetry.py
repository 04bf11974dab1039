"""Watches the worker's step stream: a span per request's prefill that joins the scheduler's trace, and step
metrics."""
import time

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Gauge, Histogram

from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.serving.tracing import context_of

_STEP_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        labels = {"model_name": model_name}
        self.step_seconds = Histogram("sluice:worker_step_seconds",
                                      "Time to execute one engine step, from its launch or the end of the step "
                                      "before it, whichever is later.",
                                      list(labels), buckets=_STEP_SECONDS, registry=registry).labels(**labels)
        self.vision_encoder_seconds = Histogram("sluice:worker_vision_encoder_seconds",
                                                "Device time of a step's vision-encoder pass over its new images.",
                                                list(labels), buckets=_STEP_SECONDS,
                                                registry=registry).labels(**labels)
        self.iteration_tokens = Histogram("vllm:iteration_tokens_total", "Tokens computed per engine step.",
                                          list(labels), buckets=_ITERATION_TOKENS, registry=registry).labels(**labels)
        self.num_requests = Gauge("sluice:worker_num_requests", "Requests whose state the worker holds.",
                                  list(labels), registry=registry).labels(**labels)
        self.warm_up_seconds = Gauge("sluice:worker_warm_up_seconds",
                                     "Time the last KV cache set-up spent warming the sampler's kernels up.",
                                     list(labels), registry=registry).labels(**labels)


class WorkerStepTelemetry:
    def __init__(self, tracer: trace.Tracer, metrics: WorkerMetrics):
        self.tracer = tracer
        self.metrics = metrics
        self._prefill_spans: dict[str, trace.Span] = {}  # until the request samples its first token
        self._last_finished = 0.0  # perf_counter: steps overlap in flight, and each counts from the last one's end

    def step_started(self, plan: StepPlan) -> float:
        """Returns the step's start time, for step_finished."""
        for request_id in plan.finished_request_ids:
            self._end_prefill(request_id)
        for new in plan.new_requests:
            if new.trace_context:
                self._prefill_spans[new.request_id] = self.tracer.start_span(
                    "sluice.worker.prefill", context=context_of(new.trace_context), attributes={
                        "sluice.request.id": new.request_id,
                        "sluice.num_tokens": len(new.token_ids),
                        "sluice.num_computed_tokens": new.num_computed_tokens,
                    })
        return time.perf_counter()

    def step_finished(self, plan: StepPlan, outcome: StepOutcome, num_live_requests: int, started: float,
                      encoder_seconds: float | None = None) -> None:
        """encoder_seconds: the step's vision-encoder pass, where it had one."""
        finished = time.perf_counter()
        self.metrics.num_requests.set(num_live_requests)
        self.metrics.step_seconds.observe(finished - max(started, self._last_finished))
        self._last_finished = finished
        if encoder_seconds is not None:
            self.metrics.vision_encoder_seconds.observe(encoder_seconds)
        self.metrics.iteration_tokens.observe(plan.total_num_scheduled_tokens)
        for request_id in outcome.sampled_token_ids:
            self._end_prefill(request_id)

    def _end_prefill(self, request_id: str) -> None:
        span = self._prefill_spans.pop(request_id, None)
        if span is not None:
            span.end()
