"""A constraint that cannot be honoured ends its request with INVALID_ARGUMENT, never with an unconstrained answer:
at validation when llguidance cannot read it or no token of the model can start it, on the stream when no token can
continue the text generated so far. No token of SmolLM2 spells the byte 0x14."""
import json
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sluice.client import chat_request, text_request

CANNOT_SPELL = "no text the model's tokens can spell satisfies it"


def _stream(services, request):
    """The chunks' text before the stream ended, and its status code and details."""
    text = ""
    try:
        for response in services.client.stream(request):
            text += response.chunk.text
    except grpc.RpcError as error:
        return text, error.code(), error.details()
    return text, grpc.StatusCode.OK, ""


@pytest.mark.slow
@pytest.mark.parametrize("constraint, field, reason", [
    (dict(json_schema="false"), "sampling.json_schema", "the schema false admits no value"),
    (dict(json_schema='{"type": "number", "maximum": NaN}'), "sampling.json_schema", "llguidance cannot read it"),
    (dict(json_schema='{"maxLength": 1e400}'), "sampling.json_schema", "llguidance cannot read it"),
    (dict(regex="\x14+"), "sampling.regex", CANNOT_SPELL),
    (dict(grammar="start: /\\x14+/"), "sampling.grammar", CANNOT_SPELL),
])
def test_constraint_that_cannot_start_is_invalid_argument_at_validation(services, constraint, field, reason):
    before = services.wait_until_idle()
    text, code, details = _stream(services, text_request("Hello", max_tokens=4, ignore_eos=True, **constraint))
    assert (text, code) == ("", grpc.StatusCode.INVALID_ARGUMENT)
    assert details.startswith(f"{field}: {reason}"), details
    assert services.load().num_free_blocks == before.num_free_blocks


@pytest.mark.slow
def test_schema_true_is_any_json_value(services):
    result = services.client.generate(chat_request("Reply with the JSON value true.", json_schema="true",
                                                   temperature=0.0, max_tokens=16))
    assert result.finish_reason == "stop", result.text
    json.loads(result.text)


@pytest.mark.slow
def test_constraint_that_dead_ends_fails_its_stream_and_spares_the_batch(services):
    """After "a" the regex needs 0x14: the stream that streamed "a" ends with INVALID_ARGUMENT, while the requests
    batched with it finish as usual."""
    before = services.wait_until_idle()
    stuck = text_request("Say a:", regex="a\x14", temperature=0.0, max_tokens=8)
    plain = text_request("The capital of France is", temperature=0.0, ignore_eos=True, max_tokens=8)
    city = chat_request("What is the capital of France?", choice=["Paris", "Rome"], temperature=0.0)
    with ThreadPoolExecutor(3) as pool:
        stuck_result = pool.submit(_stream, services, stuck)
        plain_result, city_result = pool.map(services.client.generate, [plain, city])
    text, code, details = stuck_result.result()
    assert (text, code) == ("a", grpc.StatusCode.INVALID_ARGUMENT)
    assert details == f"sampling.regex: {CANNOT_SPELL} (at output token 2)"
    assert (plain_result.finish_reason, len(plain_result.token_ids)) == ("length", 8)
    assert (city_result.finish_reason, city_result.text) == ("stop", "Paris")
    assert services.wait_until_idle().num_free_blocks == before.num_free_blocks


@pytest.mark.slow
def test_dead_end_in_one_sample_fails_the_request_and_frees_every_sample(services):
    before = services.wait_until_idle()
    request = text_request("Say a:", regex="a\x14", temperature=1.0, seed=3, n=4, ignore_eos=True, max_tokens=8)
    _, code, details = _stream(services, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(f"sampling.regex: {CANNOT_SPELL}")
    assert services.wait_until_idle().num_free_blocks == before.num_free_blocks
