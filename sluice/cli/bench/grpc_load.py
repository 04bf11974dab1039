"""Drives a running router with many concurrent streaming requests and records every token's arrival time."""
import asyncio
import random
import time

import grpc

from sluice.cli.bench.report import RequestTrace
from sluice.cli.bench.workload import BenchRequest
from sluice.core.sampling_params_pb import sampling_params_to_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


async def _one(stub, request: BenchRequest, trace: RequestTrace) -> None:
    message = pb.GenerateRequest(
        tokens=pb.TokenIds(ids=request.prompt_token_ids), return_token_ids=True,
        sampling=sampling_params_to_pb(request.sampling_params()))
    async for response in stub.Generate(message):
        if response.HasField("chunk"):
            now = time.perf_counter()
            trace.token_times.extend([now] * len(response.chunk.token_ids))


async def run_load(address: str, requests: list[BenchRequest], rate: float | None = None,
                   concurrency: int | None = None, seed: int = 0, progress=None) -> tuple[list[RequestTrace], float]:
    """rate: Poisson arrivals per second (None: all at once); concurrency: at most this many in flight."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency or len(requests))
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        stub = generation_pb2_grpc.GenerationStub(channel)
        traces: list[RequestTrace] = []

        async def limited(request: BenchRequest) -> None:
            async with limit:
                trace = RequestTrace(time.perf_counter(), len(request.prompt_token_ids))
                traces.append(trace)
                await _one(stub, request, trace)
                if progress is not None:
                    progress.update(1)

        started = time.perf_counter()
        tasks = []
        for request in requests:
            tasks.append(asyncio.create_task(limited(request)))
            if rate:
                await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        return traces, time.perf_counter() - started
