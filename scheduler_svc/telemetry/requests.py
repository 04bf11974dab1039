"""Each request's life in the scheduler as spans (queue, prefill, decode, under one request span that joins the
router's trace) and as metrics. The worker's spans join through the trace context put on each NewRequest."""
import time
from dataclasses import dataclass

from opentelemetry import trace

from sluice.core.step_plan import StepPlan
from sluice.scheduler.outputs import RequestUpdate
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import Scheduler
from sluice.scheduler.telemetry.metrics import SchedulerMetrics
from sluice.serving.tracing import carrier_of, context_of


@dataclass(slots=True)
class _Tracked:
    span: trace.Span  # the request in the scheduler
    phase: str  # "queue", "prefill" or "decode"
    phase_span: trace.Span
    phase_started: float
    arrival: float
    num_open_samples: int
    num_output_tokens: int = 0


class SchedulerTelemetry:
    def __init__(self, scheduler: Scheduler, tracer: trace.Tracer, metrics: SchedulerMetrics, model_name: str):
        self.scheduler = scheduler
        self.tracer = tracer
        self.metrics = metrics
        self.model_name = model_name
        self._tracked: dict[str, _Tracked] = {}  # by the client's request id

    def submitted(self, request: Request, trace_context) -> None:
        span = self.tracer.start_span("sluice.scheduler.request", context=context_of(trace_context), attributes={
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.id": request.request_id,
            "gen_ai.usage.input_tokens": request.num_prompt_tokens,
            "sluice.request.priority": request.priority,
        })
        now = time.monotonic()
        self._tracked[request.request_id] = _Tracked(span, "queue", self._child(span, "queue"), now, now,
                                                     request.sampling_params.n)

    def planned(self, plan: StepPlan) -> None:
        """New requests of a step leave the queue (or resume after a preemption); each carries its span's context
        to the worker."""
        for new_request in plan.new_requests:
            request = self.scheduler.get_request(new_request.request_id)
            tracked = None if request is None else self._tracked.get(request.client_request_id)
            if tracked is None:
                continue
            if tracked.phase == "queue":
                queue_time = self._next_phase(tracked, "prefill")
                self.metrics.request_queue_time.observe(queue_time)
                tracked.span.set_attribute("gen_ai.latency.time_in_queue", queue_time)
            elif request.num_preemptions:
                tracked.span.add_event("recomputed after a preemption", {"sluice.request.id": request.request_id})
            new_request.trace_context = carrier_of(tracked.phase_span)

    def updated(self, updates: list[RequestUpdate]) -> None:
        if updates:
            self.metrics.generation_tokens.inc(sum(len(update.new_token_ids) for update in updates))
        for update in updates:
            tracked = self._tracked.get(update.request_id)
            if tracked is None:
                continue
            tracked.num_output_tokens += len(update.new_token_ids)
            if update.new_token_ids and tracked.phase == "prefill":
                self.metrics.prompt_tokens.inc(update.num_prompt_tokens)
                prefill_time = self._next_phase(tracked, "decode")
                self.metrics.request_prefill_time.observe(prefill_time)
                tracked.span.set_attribute("gen_ai.latency.time_in_model_prefill", prefill_time)
            if update.finished:
                self.metrics.request_success[update.finish_reason.reported].inc()
                tracked.num_open_samples -= 1
                if tracked.num_open_samples == 0:
                    self._end(update.request_id, tracked, update)

    def _child(self, span: trace.Span, name: str) -> trace.Span:
        return self.tracer.start_span(name, context=trace.set_span_in_context(span))

    def _next_phase(self, tracked: _Tracked, phase: str) -> float:
        now = time.monotonic()
        tracked.phase_span.end()
        elapsed = now - tracked.phase_started
        tracked.phase, tracked.phase_span, tracked.phase_started = phase, self._child(tracked.span, phase), now
        return elapsed

    def _end(self, request_id: str, tracked: _Tracked, last: RequestUpdate) -> None:
        if tracked.phase == "decode":
            decode_time = time.monotonic() - tracked.phase_started
            self.metrics.request_decode_time.observe(decode_time)
            tracked.span.set_attribute("gen_ai.latency.time_in_model_decode", decode_time)
        tracked.phase_span.end()
        tracked.span.set_attributes({
            "gen_ai.usage.output_tokens": tracked.num_output_tokens,
            "gen_ai.usage.cache_read.input_tokens": last.num_cached_tokens,
            "gen_ai.response.finish_reasons": [last.finish_reason.reported],
            "gen_ai.latency.e2e": time.monotonic() - tracked.arrival,
        })
        tracked.span.end()
        del self._tracked[request_id]
