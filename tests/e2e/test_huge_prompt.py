"""A huge prompt gets a clear status while the other streams keep their pace: the router refuses client messages
over --max-request-bytes unread, and tokenizes the rest off its event loop."""
import threading
import time
from contextlib import contextmanager

import grpc
import pytest

from sluice.client import SluiceClient, text_request
from sluice.serving.grpc_options import MAX_CLIENT_REQUEST_BYTES
from tests.e2e.services import extra_router

pytestmark = pytest.mark.slow

SENTENCE = "The quick brown fox jumps over the lazy dog. "
MAX_INTER_TOKEN_GAP_SECONDS = 1.0


def _text(num_bytes: int) -> str:
    return (SENTENCE * (num_bytes // len(SENTENCE) + 1))[:num_bytes]


@contextmanager
def _concurrent_stream(client: SluiceClient):
    """A long greedy stream read in a thread; yields the list of the times its chunks arrive, once it streams."""
    arrivals: list[float] = []
    call = client.stream(text_request("Tell me a very long story about the sea.", max_tokens=4000, temperature=0.0,
                                      ignore_eos=True))

    def read():
        try:
            for _ in call:
                arrivals.append(time.monotonic())
        except grpc.RpcError:
            pass  # cancelled below

    reader = threading.Thread(target=read)
    reader.start()
    try:
        _wait_until(lambda: len(arrivals) >= 3)
        yield arrivals
    finally:
        call.cancel()
        reader.join()


def _wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the concurrent stream stopped"
        time.sleep(0.01)


def _largest_gap_over(arrivals: list[float], start: float, end: float) -> float:
    """The longest wait between two chunks of the stream over [start, end] (the chunk before start to the one after
    end)."""
    _wait_until(lambda: arrivals[-1] > end)
    times = list(arrivals)
    first = max(i for i, t in enumerate(times) if t <= start)
    last = min(i for i, t in enumerate(times) if t > end)
    return max(later - earlier for earlier, later in zip(times[first:last], times[first + 1:last + 1]))


def _refusal(client: SluiceClient, text: str) -> tuple[grpc.RpcError, float, float]:
    """The error the prompt gets, and when it was sent and answered."""
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as error:
        client.generate(text_request(text, max_tokens=4), timeout=120)
    return error.value, start, time.monotonic()


def test_a_ten_megabyte_prompt_is_refused_unread_while_other_streams_keep_their_pace(services):
    with _concurrent_stream(services.client) as arrivals:
        error, start, end = _refusal(services.client, _text(10_000_000))
        gap = _largest_gap_over(arrivals, start, end)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert gap < MAX_INTER_TOKEN_GAP_SECONDS


def test_a_long_prompt_is_tokenized_off_the_event_loop(services):
    with _concurrent_stream(services.client) as arrivals:
        error, start, end = _refusal(services.client, _text(MAX_CLIENT_REQUEST_BYTES // 4))
        gap = _largest_gap_over(arrivals, start, end)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("text: the prompt has ")
    assert gap < (end - start) / 2  # tokenizing on the event loop would stall the stream all along


def test_max_request_bytes_sets_the_routers_limit(services, default_model_dir):
    with extra_router(services, default_model_dir, "--max-request-bytes", "65536") as (_, address), \
            SluiceClient(address) as client:
        assert _refusal(client, _text(70_000))[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _refusal(client, _text(60_000))[0].details().startswith("text: the prompt has ")
