"""Hypothesis-built generation requests, many of them mutated on the wire (bytes flipped, the message truncated,
invalid UTF-8 or a lone surrogate in a string field), sent as raw bytes in concurrent batches. No call ends with
UNKNOWN or INTERNAL, nor with UNAVAILABLE (a crash) or, when it asks for a few tokens, DEADLINE_EXCEEDED (a hang); a
payload that does not parse is INVALID_ARGUMENT; every constrained stream that ends OK satisfies the constraint its
payload carries. Afterwards all three services live and the KV pool has every block free again."""
import asyncio
import json
import math

import grpc
import jsonschema
import pytest
import regex
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sluice.client import sampling_params
from sluice.v1 import generation_pb2 as pb
from tests.e2e.wire import nested

GENERATE = "/sluice.v1.Generation/Generate"
BATCH = 60  # requests in flight at once
NUM_BATCHES = 17
MAX_TOKENS = 8
CALL_TIMEOUT_SECONDS = 60
UNBOUNDED_TIMEOUT_SECONDS = 1  # for a payload whose mutation lost max_tokens: it may run to the model's length
EXPECTED_CODES = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}

# Short languages, so a few tokens can complete them; "\x14" is a byte no token of the model spells.
REGEXES = ["[a-z]{1,4}", "yes|no", r"\d{1,2}", "[A-Z][a-z]{0,2}!", "(ab)+c?", "a\x14", "[a-c]{2}\x14", "\x14+", "[a-"]
GRAMMARS = {  # Lark grammar -> its language as a regex (None: it does not compile)
    'start: "yes" | "no"': "yes|no", "start: /[0-9]{1,2}/ \"%\"": "[0-9]{1,2}%",
    'start: "(" num ")"\nnum: /[1-9]/': r"\([1-9]\)", "start: undefined_rule": None,
}
PATTERNS = {**{pattern: pattern for pattern in REGEXES}, **GRAMMARS}  # as Python's regex module reads it
SCHEMAS = ['{"type": "boolean"}', '{"enum": ["red", "green", 3]}', '{"type": "integer", "minimum": 0, "maximum": 99}',
           '{"type": "string", "maxLength": 3}', "true", "false", '{"type": "number", "maximum": NaN}',
           '{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], '
           '"additionalProperties": false}', '{"type": "array", "items": {"type": "null"}, "maxItems": 1}',
           '{"type": "no such type"}', "{not json"]
# Where a string lives in a GenerateRequest, as field numbers: request_id, text, chat content, sampling's stop,
# regex, json_schema, grammar, choice values and bad words.
STRING_FIELDS = [[1], [2], [4, 1, 2], [5, 15], [5, 20], [5, 19], [5, 22], [5, 21, 1], [5, 25]]
NOT_UTF8 = [b"\xc3", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80", b"\xff"]

VOCAB = 49_152
any_token_id = st.integers(-2, VOCAB + 8)
token_id = st.integers(0, VOCAB - 1)
short_text = st.text(max_size=6)
constraints = st.one_of(
    st.none(), st.none(),
    st.fixed_dictionaries({"regex": st.sampled_from(REGEXES)}),
    st.fixed_dictionaries({"grammar": st.sampled_from(sorted(GRAMMARS))}),
    st.fixed_dictionaries({"json_schema": st.sampled_from(SCHEMAS)}),
    st.fixed_dictionaries({"choice": st.lists(st.sampled_from(["yes", "no", "Paris", "42", ""]), max_size=3)}),
)
in_range_sampling = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, MAX_TOKENS)},
    optional={
        "temperature": st.floats(0, 1.5),
        "top_p": st.floats(0.05, 1),
        "top_k": st.just(-1) | st.integers(1, 50),
        "min_p": st.floats(0, 0.5),
        "seed": st.integers(0, 2**64 - 1),
        "ignore_eos": st.booleans(),
        "n": st.integers(1, 3),
        "presence_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.5, 2),
        "logit_bias": st.dictionaries(token_id, st.floats(-100, 100), max_size=2),
        "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2),
        "stop_token_ids": st.lists(token_id, max_size=2),
        "logprobs": st.integers(0, 3),
        "prompt_logprobs": st.integers(0, 2),
        "truncate_prompt_tokens": st.integers(1, 6),
    },
)
out_of_range_sampling = st.fixed_dictionaries(
    {"max_tokens": st.integers(0, MAX_TOKENS) | st.just(10**6)},
    optional={
        "temperature": st.floats(-1, 3) | st.sampled_from([math.nan, math.inf]),
        "top_p": st.floats(-0.1, 1.2) | st.just(math.nan),
        "top_k": st.integers(-3, 60),
        "min_p": st.floats(-0.1, 1.1),
        "min_tokens": st.integers(0, 3),
        "n": st.integers(0, 4) | st.just(17),
        "frequency_penalty": st.floats(-3, 3) | st.just(math.nan),
        "repetition_penalty": st.floats(-0.5, 2),
        "logit_bias": st.dictionaries(any_token_id, st.floats(-150, 150), max_size=2),
        "stop": st.lists(short_text, max_size=2),
        "stop_token_ids": st.lists(any_token_id, max_size=2),
        "logprobs": st.integers(0, 21),
        "allowed_token_ids": st.lists(any_token_id, max_size=3),
        "truncate_prompt_tokens": st.integers(0, 6),
        "bad_words": st.lists(short_text, max_size=2),
    },
)
inputs = st.one_of(
    st.builds(lambda text: {"text": text}, st.text(min_size=1, max_size=24)),
    st.sampled_from([{"text": ""}, {}]),
    st.builds(lambda ids: {"tokens": pb.TokenIds(ids=ids)}, st.lists(token_id, min_size=1, max_size=8)),
    st.builds(lambda ids: {"tokens": pb.TokenIds(ids=ids)}, st.lists(any_token_id, max_size=8)),
    st.builds(lambda messages: {"chat": pb.ChatMessages(messages=messages)},
              st.lists(st.builds(pb.ChatMessage, role=st.sampled_from(["user", "assistant", "bogus"]),
                                 content=st.text(max_size=16)), max_size=2)),
)


@st.composite
def requests(draw) -> pb.GenerateRequest:
    fields = draw(st.one_of(in_range_sampling, in_range_sampling, out_of_range_sampling))
    sampling = sampling_params(**fields, **(draw(constraints) or {}))
    return pb.GenerateRequest(**draw(inputs), sampling=sampling, priority=draw(st.integers(-3, 3)),
                              return_token_ids=draw(st.booleans()), cache_salt=draw(st.sampled_from(["", "a"])))


@st.composite
def payloads(draw) -> bytes:
    """A serialized request, as it is or with one wire mutation."""
    data = draw(requests()).SerializeToString()
    mutation = draw(st.sampled_from(["none", "none", "none", "flip", "truncate", "utf8"]))
    if mutation == "flip" and data:
        flipped = bytearray(data)
        for _ in range(draw(st.integers(1, 3))):
            flipped[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        return bytes(flipped)
    if mutation == "truncate" and data:
        return data[:draw(st.integers(0, len(data) - 1))]
    if mutation == "utf8":
        payload = draw(short_text).encode() + draw(st.sampled_from(NOT_UTF8)) + draw(short_text).encode()
        return data + nested(draw(st.sampled_from(STRING_FIELDS)), payload)
    return data


def _parsed(payload: bytes) -> pb.GenerateRequest | None:
    try:
        return pb.GenerateRequest.FromString(payload)
    except DecodeError:
        return None


def _unbounded(request: pb.GenerateRequest | None) -> bool:
    return request is not None and not 1 <= request.sampling.max_tokens <= MAX_TOKENS


async def _call(generate, payload: bytes):
    """The call's status code and details, and what it streamed before it ended."""
    responses = []
    unbounded = _unbounded(_parsed(payload))
    call = generate(payload, timeout=UNBOUNDED_TIMEOUT_SECONDS if unbounded else CALL_TIMEOUT_SECONDS)
    try:
        async for response in call:
            responses.append(response)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details(), responses
    return grpc.StatusCode.OK, "", responses


async def _send_all(address: str, batch: list[bytes]):
    async with grpc.aio.insecure_channel(address) as channel:
        generate = channel.unary_stream(GENERATE, response_deserializer=pb.GenerateResponse.FromString)
        return await asyncio.gather(*(_call(generate, payload) for payload in batch))


def _check(payload: bytes, code: grpc.StatusCode, details: str, responses: list[pb.GenerateResponse]) -> int:
    """Asserts what the call's outcome must be for its payload; returns how many of its samples' texts were checked
    against a constraint in full."""
    request = _parsed(payload)
    expected = EXPECTED_CODES | {grpc.StatusCode.DEADLINE_EXCEEDED} if _unbounded(request) else EXPECTED_CODES
    assert code in expected, (code, details, payload)
    if request is None:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, payload
        return 0
    if code != grpc.StatusCode.OK:
        assert details, (code, payload)
        return 0
    texts, reasons = {}, {}
    for response in responses:
        if response.HasField("chunk"):
            texts[response.chunk.index] = texts.get(response.chunk.index, "") + response.chunk.text
        else:
            reasons[response.complete.index] = response.complete.finish_reason
    sampling = request.sampling
    assert sorted(reasons) == list(range(sampling.n if sampling.HasField("n") else 1)), responses
    # A sample ends with STOP at a grammar's end (or on EOS, which a grammar allows only there) unless a stop string
    # or a stop token cut it short; any other sample holds the start of a match.
    cut = bool(sampling.stop or sampling.stop_token_ids)
    return sum(_check_constraint(sampling, texts.get(index, ""), reason == pb.FINISH_REASON_STOP and not cut)
               for index, reason in reasons.items())


def _check_constraint(sampling: pb.SamplingParams, text: str, complete: bool) -> bool:
    """Asserts that the text satisfies the constraint, in full or (not complete) as the start of a match, where the
    test knows the constraint (a flipped byte may have rewritten it). True if the text was checked in full."""
    kind = sampling.WhichOneof("constraint")
    if kind == "choice":
        values = list(sampling.choice.values)
        assert (text in values) if complete else any(value.startswith(text) for value in values), (values, text)
    elif kind in ("regex", "grammar") and (pattern := PATTERNS.get(getattr(sampling, kind))) is not None:
        assert regex.fullmatch(pattern, text, partial=not complete), (pattern, text, complete)
    elif kind == "json_schema" and sampling.json_schema in SCHEMAS and complete:
        jsonschema.validate(json.loads(text), json.loads(sampling.json_schema))
    else:
        return False
    return complete


@pytest.mark.slow
def test_fuzzed_requests_get_clear_statuses_and_leave_the_services_whole(services):
    baseline = services.wait_until_idle().num_free_blocks
    outcomes = []

    @settings(max_examples=NUM_BATCHES, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(payloads(), min_size=BATCH, max_size=BATCH))
    def send_batch(batch: list[bytes]) -> None:
        results = asyncio.run(_send_all(services.layout.router_address, batch))
        outcomes.extend((code, _check(payload, code, details, responses))
                        for payload, (code, details, responses) in zip(batch, results))

    send_batch()
    assert len(outcomes) >= 1000
    assert sum(code == grpc.StatusCode.OK for code, _ in outcomes) >= 200  # a good share of the requests ran
    assert sum(num_checked for _, num_checked in outcomes) >= 10  # and of the constrained ones, to their end
    assert [process.poll() for process in services.processes] == [None, None, None]
    assert services.wait_until_idle().num_free_blocks == baseline
