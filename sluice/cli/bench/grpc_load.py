"""Drives a running router with many concurrent streaming requests and records every token's arrival time."""
import contextlib
import itertools
import time

import grpc

from sluice.cli.bench.arrivals import drive
from sluice.cli.bench.report import RequestTrace
from sluice.cli.bench.workload import BenchRequest
from sluice.client import user_message
from sluice.core.sampling_params_pb import sampling_params_to_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


def connections_for(router_processes: int) -> int:
    """Client connections enough that the kernel's spread of them over router processes sharing a port reaches
    each."""
    return 1 if router_processes == 1 else 4 * router_processes


async def run_load(address: str, requests: list[BenchRequest], rate: float | None = None,
                   concurrency: int | None = None, seed: int = 0, progress=None,
                   connections: int = 1) -> tuple[list[RequestTrace], float]:
    """rate: Poisson arrivals per second (None: all at once); concurrency: at most this many in flight; the requests
    go round-robin over `connections` TCP connections (router processes sharing a port each take some)."""
    options = CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)]  # else channels to one address share one
    async with contextlib.AsyncExitStack() as stack:
        channels = [await stack.enter_async_context(grpc.aio.insecure_channel(address, options=options))
                    for _ in range(connections)]
        stubs = itertools.cycle([generation_pb2_grpc.GenerationStub(channel) for channel in channels])

        async def send(request: BenchRequest, trace: RequestTrace) -> None:
            stub = next(stubs)
            async for response in stub.Generate(_generate_request(request)):
                if response.HasField("chunk"):
                    now = time.perf_counter()
                    trace.token_times.extend([now] * len(response.chunk.token_ids))
                elif response.HasField("complete"):  # the router's count: a chat template's and image placeholders too
                    trace.num_prompt_tokens = response.complete.usage.prompt_tokens

        return await drive(send, requests, rate, concurrency, seed, progress)


def _generate_request(request: BenchRequest) -> pb.GenerateRequest:
    """Token ids, or with images one user message of them and the prompt's text."""
    sampling = sampling_params_to_pb(request.sampling_params())
    if request.images:
        chat = pb.ChatMessages(messages=[user_message(request.prompt_text, request.images)])
        return pb.GenerateRequest(chat=chat, return_token_ids=True, sampling=sampling)
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=request.prompt_token_ids), return_token_ids=True,
                              sampling=sampling)
