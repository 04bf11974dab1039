"""Requests that do not decode (a string field that is not UTF-8, a lone surrogate, a truncated or corrupt message)
are INVALID_ARGUMENT naming the field where one is to blame, for unary and streaming methods alike, and the router
keeps serving."""
import grpc
import pytest

from sluice.client import text_request
from sluice.v1 import generation_pb2 as pb
from tests.e2e.wire import nested

GENERATE = "/sluice.v1.Generation/Generate"
TOKENIZE = "/sluice.v1.Generation/Tokenize"
NOT_UTF8 = b"caf\xc3"  # the first byte of a two-byte character, then the end
LONE_SURROGATE = b"\xed\xa0\x80"  # U+D800 as UTF-8 encodes it
CORRUPT = "request: not a valid sluice.v1.GenerateRequest: truncated or corrupt"


def _valid() -> bytes:
    return text_request("Hello", regex="[a-z]+", stop=["x"], max_tokens=2).SerializeToString()


@pytest.fixture()
def raw_channel(services):
    with grpc.insecure_channel(services.layout.router_address) as channel:
        yield channel


@pytest.mark.slow
@pytest.mark.parametrize("payload, details", [
    (_valid() + nested([2], NOT_UTF8), "text: not valid UTF-8"),
    (_valid() + nested([2], b"a" + LONE_SURROGATE), "text: not valid UTF-8"),
    (_valid() + nested([1], b"\xff"), "request_id: not valid UTF-8"),
    (_valid() + nested([5, 20], NOT_UTF8), "sampling.regex: not valid UTF-8"),
    (_valid() + nested([5, 15], LONE_SURROGATE), "sampling.stop: not valid UTF-8"),
    (_valid() + nested([5, 21, 1], NOT_UTF8), "sampling.choice.values: not valid UTF-8"),
    (nested([4, 1, 2], NOT_UTF8), "chat.messages.content: not valid UTF-8"),
    (_valid()[:-1], CORRUPT),
    (b"\x12\x7fHello", CORRUPT),  # a 127-byte text with 5 bytes
    (b"\xff" * 12, CORRUPT),
])
def test_undecodable_generate_request_is_invalid_argument(services, raw_channel, payload, details):
    generate = raw_channel.unary_stream(GENERATE, response_deserializer=pb.GenerateResponse.FromString)
    with pytest.raises(grpc.RpcError) as error:
        list(generate(payload))
    assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, details)
    result = services.client.generate(text_request("The capital of France is", max_tokens=2, temperature=0.0))
    assert len(result.token_ids) == 2


@pytest.mark.slow
def test_undecodable_unary_request_is_invalid_argument(raw_channel):
    tokenize = raw_channel.unary_unary(TOKENIZE, response_deserializer=pb.TokenizeResponse.FromString)
    with pytest.raises(grpc.RpcError) as error:
        tokenize(nested([1], NOT_UTF8))
    assert (error.value.code(), error.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "text: not valid UTF-8")
    assert tokenize(pb.TokenizeRequest(text="Hello").SerializeToString()).token_ids
