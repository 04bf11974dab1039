import time

import grpc
import pytest

from sluice.client import text_request
from sluice.v1 import generation_pb2 as pb


def _wait_for_idle(services, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        load = services.load()
        if load.num_running == 0 and load.num_waiting == 0:
            return load
        time.sleep(0.05)
    raise AssertionError(f"scheduler still busy: {services.load()}")


def test_client_cancel_frees_blocks(services):
    before = _wait_for_idle(services)
    call = services.client.stream(text_request("Tell me a very long story about dragons.", max_tokens=500,
                                               temperature=0.0, ignore_eos=True))
    chunks = 0
    for response in call:
        chunks += response.HasField("chunk")
        if chunks == 3:
            break
    assert services.load().num_running == 1
    call.cancel()
    after = _wait_for_idle(services)
    assert after.num_free_blocks == before.num_free_blocks
    assert after.num_used_blocks == before.num_used_blocks


def test_abort_rpc_ends_the_stream(services):
    request = text_request("Count from one to a thousand:", max_tokens=500, temperature=0.0, ignore_eos=True)
    request.request_id = "abort-me"
    call = services.client.stream(request)
    next(call)
    assert services.client.abort("abort-me")
    last = list(call)[-1]
    assert last.complete.finish_reason == pb.FINISH_REASON_ABORT
    _wait_for_idle(services)


@pytest.mark.parametrize("request_, field", [
    (pb.GenerateRequest(text=""), "text"),
    (pb.GenerateRequest(), "input"),
    (pb.GenerateRequest(tokens=pb.TokenIds()), "tokens"),
    (pb.GenerateRequest(tokens=pb.TokenIds(ids=[1, 10**7])), "tokens"),
    (pb.GenerateRequest(chat=pb.ChatMessages()), "chat"),
    (text_request("hi", max_tokens=0), "sampling.max_tokens"),
    (text_request("hi", max_tokens=10**6), "sampling.max_tokens"),
    (text_request("hi", temperature=-1.0), "sampling.temperature"),
    (text_request("hi", temperature=float("nan")), "sampling.temperature"),
    (text_request("hi", top_p=0.0), "sampling.top_p"),
    (text_request("hi", top_k=-2), "sampling.top_k"),
    (text_request("hi", min_p=1.5), "sampling.min_p"),
])
def test_bad_input_is_invalid_argument_and_server_keeps_serving(services, request_, field):
    with pytest.raises(grpc.RpcError) as error:
        services.client.generate(request_)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}:")
    result = services.client.generate(text_request("The capital of France is", max_tokens=4, temperature=0.0))
    assert len(result.token_ids) == 4


def test_deadline_exceeded_frees_blocks(services):
    before = _wait_for_idle(services)
    with pytest.raises(grpc.RpcError) as error:
        request = text_request("Write a long essay.", max_tokens=2000, temperature=0.0, ignore_eos=True)
        services.client.generate(request, timeout=0.5)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = _wait_for_idle(services)
    assert after.num_free_blocks == before.num_free_blocks
