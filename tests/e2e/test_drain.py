import signal
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.client import SluiceClient, text_request
from tests.e2e.services import extra_router

DRAIN_TIMEOUT = 30.0
NUM_STREAMS = 8
MAX_TOKENS = 32


def _stream(address: str, started: threading.Semaphore, results: list) -> None:
    request = text_request("Tell me about the history of bridges.", max_tokens=MAX_TOKENS, temperature=0.0,
                           ignore_eos=True)
    with SluiceClient(address) as client:
        tokens = 0
        for response in client.stream(request):
            if response.HasField("chunk"):
                if tokens == 0:
                    started.release()
                tokens += 1
            else:
                results.append(response.complete.usage.completion_tokens)


def test_sigterm_drains_streams_in_flight_then_exits(services, default_model_dir):
    with extra_router(services, default_model_dir, "--drain-timeout", str(DRAIN_TIMEOUT)) as (router, address):
        started, results = threading.Semaphore(0), []
        streams = [threading.Thread(target=_stream, args=(address, started, results)) for _ in range(NUM_STREAMS)]
        for stream in streams:
            stream.start()
        for _ in streams:
            assert started.acquire(timeout=30)
        with grpc.insecure_channel(address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service="sluice.v1.Generation"))
            assert next(watch).status == health_pb2.HealthCheckResponse.SERVING

            router.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
            with SluiceClient(address) as late_client:
                try:
                    late_client.generate(text_request("Too late", max_tokens=4))
                    raise AssertionError("a request during the drain was accepted")
                except grpc.RpcError as error:
                    assert error.code() == grpc.StatusCode.UNAVAILABLE

            for stream in streams:
                stream.join(timeout=DRAIN_TIMEOUT)
            assert results == [MAX_TOKENS] * NUM_STREAMS
            assert router.wait(timeout=DRAIN_TIMEOUT) == 0
            assert time.monotonic() - signalled < DRAIN_TIMEOUT
