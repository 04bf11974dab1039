"""Sends a workload's requests by Poisson arrivals or all at once, at most so many in flight, and traces each."""
import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from sluice.cli.bench.report import RequestTrace
from sluice.cli.bench.workload import BenchRequest

Send = Callable[[BenchRequest, RequestTrace], Awaitable[None]]


async def drive(send: Send, requests: list[BenchRequest], rate: float | None = None, concurrency: int | None = None,
                seed: int = 0, progress=None) -> tuple[list[RequestTrace], float]:
    """rate: Poisson arrivals per second (None: all at once); concurrency: at most this many in flight. `send`
    appends each output token's arrival time to the trace."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency or len(requests))
    traces: list[RequestTrace] = []

    async def limited(request: BenchRequest) -> None:
        async with limit:
            trace = RequestTrace(time.perf_counter(), len(request.prompt_token_ids))
            traces.append(trace)
            await send(request, trace)
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
