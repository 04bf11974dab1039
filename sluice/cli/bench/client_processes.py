"""The gRPC load from several client processes, one event loop each, for a stack that streams tokens faster than one
client loop takes them in. The requests are dealt out round-robin, each process with its share of the concurrency
and connections; the processes start sending together, and their traces share the clock (perf_counter is the
system's monotonic clock)."""
import asyncio
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from sluice.cli.bench.grpc_load import run_load
from sluice.cli.bench.process_cpu import ProcessCpu
from sluice.cli.bench.report import RequestTrace
from sluice.cli.bench.workload import BenchRequest

Cpu = dict[str, float]  # a process's busy cores and its busiest thread's, as ProcessCpu reports them


def timed_load(address: str, requests: list[BenchRequest], concurrency: int | None = None, connections: int = 1,
               processes: int = 1) -> tuple[list[RequestTrace], float, Cpu]:
    """(traces, seconds from the first request sent to the last token, the clients' CPU: cores summed over the
    processes, the busiest thread of any)."""
    processes = min(processes, len(requests), concurrency or len(requests))
    if processes <= 1:
        return _load_share(address, requests, concurrency, connections)
    context = get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(processes, mp_context=context) as pool:
        start = manager.Barrier(processes)
        shares = [pool.submit(_load_share, address, requests[i::processes], _part(concurrency, i, processes),
                              _part(connections, i, processes) or 1, start) for i in range(processes)]
        results = [share.result() for share in shares]
    traces = [trace for share_traces, _, _ in results for trace in share_traces]
    started = min(trace.sent_at for trace in traces)
    duration = max(trace.token_times[-1] if trace.token_times else trace.sent_at for trace in traces) - started
    cpu = {"cores": sum(share_cpu["cores"] * seconds for _, seconds, share_cpu in results) / duration,
           "busiest_thread_cores": max(share_cpu["busiest_thread_cores"] * seconds
                                       for _, seconds, share_cpu in results) / duration}
    return traces, duration, cpu


def _load_share(address: str, requests: list[BenchRequest], concurrency: int | None, connections: int,
                start=None) -> tuple[list[RequestTrace], float, Cpu]:
    if start is not None:
        start.wait()
    cpu = ProcessCpu({"client": os.getpid()})
    traces, duration = asyncio.run(run_load(address, requests, concurrency=concurrency, connections=connections))
    return traces, duration, cpu.busy_cores(duration)["client"]


def _part(total: int | None, index: int, parts: int) -> int | None:
    """The index-th of `parts` near-equal parts of total (None: unbounded)."""
    return None if total is None else total // parts + (index < total % parts)
