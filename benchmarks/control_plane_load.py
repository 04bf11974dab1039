"""The control plane at GPU step rates, on any machine: the real router and scheduler under the standard throughput
workload (256 requests, 100-1024 tokens in and out), over a worker stand-in that samples token 7 and takes a modelled
device time per step, fitted to Qwen3-0.6B on an H200: 0.8 ms + 30 us per sequence + 2.2 us per token.

Reports how far the client's last token trails the stand-in's last outcome (a router that cannot keep up shows as a
lag) and the CPU each process spends per output token. --speed 2 runs the steps twice as fast as the model, which
stands for a host with half the CPU speed.

    python benchmarks/control_plane_load.py [--speed 2] [--router-processes 2] [--client-processes 2]
"""
import argparse
import asyncio
import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sluice.cli.bench.client_processes import timed_load
from sluice.cli.bench.grpc_load import connections_for, run_load
from sluice.cli.bench.process_cpu import ProcessCpu
from sluice.cli.bench.workload import random_workload
from sluice.cli.launcher import ServeLayout, start_routers, stop_services, wait_until_routers_serve
from sluice.cli.python_command import sluice_command
from sluice.core.step_plan import StepOutcome
from sluice.core.step_plan_pb import outcome_to_pb, plan_from_pb
from sluice.v1 import worker_pb2 as pb
from sluice.v1 import worker_pb2_grpc

VOCAB_SIZE = 151936


class ModelledWorker(worker_pb2_grpc.WorkerServicer):
    def __init__(self, speed: float):
        self.speed = speed
        self.num_tokens: dict[str, int] = {}  # prompt plus sampled tokens, per request
        self.num_computed: dict[str, int] = {}
        self.last_outcome = 0.0

    async def GetInfo(self, request, context):
        return pb.WorkerInfo(model="modelled", architecture="modelled", max_model_len=8192, vocab_size=VOCAB_SIZE,
                             dtype="bfloat16", eos_token_ids=[0], world_size=1, kv_role="both")

    async def InitCache(self, request, context):
        return pb.InitCacheResponse(num_blocks=request.num_blocks or 60000, block_size=request.block_size)

    async def Execute(self, request_iterator, context):
        finished: asyncio.Queue = asyncio.Queue()
        reader = asyncio.create_task(self._run_steps(request_iterator, finished))
        while (item := await finished.get()) is not None:
            done_at, outcome = item
            while (left := done_at - time.perf_counter()) > 0:
                await asyncio.sleep(left - 0.001 if left > 0.002 else 0)  # the loop's timers round to 1 ms
            self.last_outcome = time.perf_counter()
            yield outcome_to_pb(outcome)
        await reader

    async def _run_steps(self, request_iterator, finished: asyncio.Queue) -> None:
        device_free = 0.0
        async for message in request_iterator:
            plan = plan_from_pb(message)
            for request_id in plan.finished_request_ids:
                self.num_tokens.pop(request_id, None)
                self.num_computed.pop(request_id, None)
            for new in plan.new_requests:
                self.num_tokens[new.request_id] = len(new.token_ids)
                self.num_computed[new.request_id] = new.num_computed_tokens
            sampled = {}
            for request_id, count in plan.num_scheduled_tokens.items():
                self.num_computed[request_id] += count
                if self.num_computed[request_id] >= self.num_tokens[request_id]:
                    sampled[request_id] = 7
                    self.num_tokens[request_id] += 1
            seconds = (0.0008 + 30e-6 * len(sampled) + 2.2e-6 * plan.total_num_scheduled_tokens) / self.speed
            device_free = max(time.perf_counter(), device_free) + seconds
            await finished.put((device_free, StepOutcome(plan.step_id, sampled)))
        await finished.put(None)


async def serve_worker(address: str, speed: float) -> None:
    server = grpc.aio.server()
    worker = ModelledWorker(speed)
    worker_pb2_grpc.add_WorkerServicer_to_server(worker, server)
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    await checker.set("sluice.v1.Worker", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(address)
    await server.start()
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    await stopped.wait()
    print(worker.last_outcome, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--router-processes", type=int, default=1, help="routers sharing the port, as `sluice serve "
                                                                        "--router-processes` starts them")
    parser.add_argument("--client-processes", type=int, default=1, help="load client processes")
    parser.add_argument("--serve-worker", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker:
        asyncio.run(serve_worker(args.serve_worker, args.speed))
        return
    layout = ServeLayout.on_free_ports(router_processes=args.router_processes)
    worker, scheduler = layout.worker_addresses, layout.scheduler_address
    cli = [*sluice_command(), "--log-level", "WARNING"]
    processes = {
        "worker": subprocess.Popen([sys.executable, __file__, "--serve-worker", worker, "--speed", str(args.speed)],
                                   stdout=subprocess.PIPE, text=True),
        "scheduler": subprocess.Popen([*cli, "scheduler", "--listen", scheduler, "--worker", worker,
                                       "--max-model-len", "4096"]),
    } | dict(zip(layout.router_names, start_routers(layout, [["--no-tokenizer"]] * args.router_processes)))
    connections = connections_for(args.router_processes)
    try:
        wait_until_routers_serve(layout, 120, list(processes.values()))
        asyncio.run(run_load(layout.router_address, random_workload(4, (100, 1024), (100, 1024), VOCAB_SIZE, 1),
                             connections=connections))
        requests = random_workload(args.num_requests, (100, 1024), (100, 1024), VOCAB_SIZE, 0)
        cpu = ProcessCpu({name: process.pid for name, process in processes.items()})
        traces, duration, client_cpu = timed_load(layout.router_address, requests, connections=connections,
                                                  processes=args.client_processes)
        busy_cores = cpu.busy_cores(duration) | {"client": client_cpu}
    finally:
        stop_services(list(processes.values()))
    last_outcome = float(processes["worker"].stdout.read()) - min(trace.sent_at for trace in traces)
    tokens = sum(len(trace.token_times) for trace in traces)
    print(f"speed {args.speed}: {tokens} tokens; the stand-in's last outcome at {last_outcome:.3f} s, the client's "
          f"last token at {duration:.3f} s ({tokens / duration:,.0f} tok/s)")
    print("CPU per output token: " + ", ".join(f"{name} {1e6 * report['cores'] * duration / tokens:.1f} us"
                                               for name, report in busy_cores.items()))


if __name__ == "__main__":
    main()
