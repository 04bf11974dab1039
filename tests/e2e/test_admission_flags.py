"""`sluice scheduler --max-waiting-requests / --max-waiting-tokens` bound the waiting queue: a request beyond either
bound gets RESOURCE_EXHAUSTED before any chunk, and nothing it asked for stays held."""
import time

import grpc
import pytest

from sluice.client import sampling_params
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import scheduler_pb2
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow

MAX_WAITING_TOKENS = 512  # the least the scheduler takes: its --max-model-len


@pytest.fixture(scope="module")
def one_at_a_time(default_model_dir):
    """One request runs at a time; at most two requests and 512 tokens wait."""
    with running_services(default_model_dir, scheduler_args=[
            "--max-num-seqs", "1", "--max-model-len", str(MAX_WAITING_TOKENS), "--max-waiting-requests", "2",
            "--max-waiting-tokens", str(MAX_WAITING_TOKENS)]) as services:
        yield services


def _tokens(first_id: int, num_tokens: int, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=list(range(first_id, first_id + num_tokens))),
                              sampling=sampling_params(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


def _wait_for(services, condition, timeout: float = 30.0) -> scheduler_pb2.Load:
    deadline = time.monotonic() + timeout
    while not condition(load := services.load()):
        assert time.monotonic() < deadline, f"scheduler load stayed {load}"
        time.sleep(0.02)
    return load


def _refused(services, request: pb.GenerateRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        next(services.client.stream(request, timeout=30))
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return error.value


def test_a_full_queue_refuses_with_resource_exhausted_and_frees_everything(one_at_a_time):
    services = one_at_a_time
    idle = _wait_for(services, lambda load: load.num_running == load.num_waiting == 0)
    running = services.client.stream(_tokens(100, 8, max_tokens=400))
    next(running)
    long_waiting = services.client.stream(_tokens(1000, 400, max_tokens=8))
    _wait_for(services, lambda load: load.num_waiting == 1)

    assert "max_waiting_tokens" in _refused(services, _tokens(2000, 200, max_tokens=8)).details()
    short_waiting = services.client.stream(_tokens(3000, 20, max_tokens=8))
    _wait_for(services, lambda load: load.num_waiting == 2)
    assert "max_waiting_requests" in _refused(services, _tokens(4000, 20, max_tokens=8)).details()

    for call in (running, long_waiting, short_waiting):
        call.cancel()
    after = _wait_for(services, lambda load: load.num_running == load.num_waiting == 0)
    assert after.num_free_blocks == idle.num_free_blocks
    completed = list(services.client.stream(_tokens(5000, 20, max_tokens=8)))
    assert completed[-1].complete.finish_reason == pb.FINISH_REASON_LENGTH
