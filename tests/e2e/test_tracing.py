import secrets

from sluice.client import text_request

PROMPT = "The secret recipe for the perfect pancake is"
SERVICES = {"sluice-router", "sluice-scheduler", "sluice-worker"}


def _generate_traced(services, trace_id: str) -> list:
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    request = text_request(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True)
    return list(services.client.stub.Generate(request, metadata=[("traceparent", traceparent)]))


def test_one_request_is_one_trace_with_spans_from_all_three_processes(services):
    trace_id = secrets.token_hex(16)
    responses = _generate_traced(services, trace_id)
    assert responses[-1].complete.usage.completion_tokens == 8

    spans = services.collector.wait_for_trace(trace_id, SERVICES)
    by_name = {span.name: span for span in spans}
    assert {span.service for span in spans} == SERVICES
    assert {"queue", "prefill", "decode", "sluice.scheduler.request", "sluice.worker.prefill"} <= set(by_name)

    generation = next(span for span in spans if span.attributes.get("gen_ai.operation.name"))
    assert generation.service == "sluice-router"
    assert generation.attributes["gen_ai.request.model"] == "SmolLM2-135M-Instruct"
    assert generation.attributes["gen_ai.usage.input_tokens"] == responses[-1].complete.usage.prompt_tokens
    assert generation.attributes["gen_ai.usage.output_tokens"] == 8
    assert generation.attributes["gen_ai.latency.time_to_first_token"] > 0

    scheduler_request = by_name["sluice.scheduler.request"]
    assert scheduler_request.parent_span_id == generation.span_id
    for phase in ("queue", "prefill", "decode"):
        assert by_name[phase].service == "sluice-scheduler"
        assert by_name[phase].parent_span_id == scheduler_request.span_id
    assert by_name["sluice.worker.prefill"].parent_span_id == by_name["prefill"].span_id


def test_prompt_text_is_not_recorded(services):
    trace_id = secrets.token_hex(16)
    _generate_traced(services, trace_id)
    spans = services.collector.wait_for_trace(trace_id, SERVICES)
    recorded = " ".join(str(value) for span in spans for value in span.attributes.values())
    assert "pancake" not in recorded


def test_health_checks_are_not_traced(services):
    trace_id = secrets.token_hex(16)
    _generate_traced(services, trace_id)
    assert services.collector.wait_for_trace(trace_id, SERVICES)
    names = {span.name for span in services.collector.spans()}
    assert "/sluice.v1.Generation/Generate" in names
    assert not any("grpc.health" in name or "Reflection" in name for name in names)
