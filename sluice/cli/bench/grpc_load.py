"""Drives a running router with many concurrent streaming requests and records every token's arrival time."""
import time

import grpc

from sluice.cli.bench.arrivals import drive
from sluice.cli.bench.report import RequestTrace
from sluice.cli.bench.workload import BenchRequest
from sluice.core.sampling_params_pb import sampling_params_to_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


async def run_load(address: str, requests: list[BenchRequest], rate: float | None = None,
                   concurrency: int | None = None, seed: int = 0, progress=None) -> tuple[list[RequestTrace], float]:
    """rate: Poisson arrivals per second (None: all at once); concurrency: at most this many in flight."""
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)

        async def send(request: BenchRequest, trace: RequestTrace) -> None:
            message = pb.GenerateRequest(
                tokens=pb.TokenIds(ids=request.prompt_token_ids), return_token_ids=True,
                sampling=sampling_params_to_pb(request.sampling_params()))
            async for response in stub.Generate(message):
                if response.HasField("chunk"):
                    now = time.perf_counter()
                    trace.token_times.extend([now] * len(response.chunk.token_ids))

        return await drive(send, requests, rate, concurrency, seed, progress)
