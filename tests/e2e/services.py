"""Starts the three real services as subprocesses on loopback, as `sluice serve` does, with tracing to a collector in
the test process and a Prometheus endpoint on each."""
import os
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.cli.launcher import ServeLayout, free_port, free_ports, start_services, stop_services, wait_until_serving
from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient
from sluice.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.e2e.trace_collector import TraceCollector


class RunningServices:
    def __init__(self, layout: ServeLayout, processes, metrics_ports: dict[str, int], collector: TraceCollector,
                 env: dict[str, str]):
        self.layout = layout
        self.processes = processes
        self.metrics_ports = metrics_ports  # "router", "scheduler", "worker" -> port
        self.collector = collector
        self.env = env
        self.client = SluiceClient(layout.router_address)
        self._scheduler_channel = grpc.insecure_channel(layout.scheduler_address)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._scheduler_channel)

    def load(self) -> scheduler_pb2.Load:
        return self._scheduler.GetLoad(scheduler_pb2.GetLoadRequest())

    def wait_until_idle(self, timeout: float = 10.0) -> scheduler_pb2.Load:
        """The scheduler's load once no request runs or waits."""
        deadline = time.monotonic() + timeout
        while (load := self.load()).num_running or load.num_waiting:
            assert time.monotonic() < deadline, f"scheduler still busy: {load}"
            time.sleep(0.05)
        return load

    def metrics_url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[service]}/metrics"

    def close(self) -> None:
        self.client.close()
        self._scheduler_channel.close()


def traced_env(collector: TraceCollector) -> dict[str, str]:
    """The services' environment: spans go to the collector, exported every 100 ms."""
    return {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@contextmanager
def running_services(model: Path | str, scheduler_args: list[str] = (), worker_args: list[str] = (),
                     router_args: list[str] | None = None, tensor_parallel_size: int = 1,
                     pipeline_parallel_size: int = 1, env: dict[str, str] | None = None):
    """router_args default to the model's tokenizer. At tensor_parallel_size N and pipeline_parallel_size P, the
    worker process starts N x P ranks. env: variables the services get besides this process's."""
    num_ranks = tensor_parallel_size * pipeline_parallel_size
    layout = ServeLayout.on_free_ports(num_ranks=num_ranks)
    router_metrics, scheduler_metrics = free_ports(2)
    worker_metrics = free_ports(1, run=num_ranks)[0]  # rank r serves its metrics on this port + r
    metrics_ports = {"router": router_metrics, "scheduler": scheduler_metrics, "worker": worker_metrics}
    collector = TraceCollector()
    env = {**traced_env(collector), **(env or {})}

    def flags(service: str, *args) -> list[str]:
        return [*args, "--metrics-port", str(metrics_ports[service])]

    tensor_parallel = ["--tensor-parallel-size", str(tensor_parallel_size)] if tensor_parallel_size > 1 else []
    if pipeline_parallel_size > 1:
        tensor_parallel += ["--pipeline-parallel-size", str(pipeline_parallel_size)]
    processes = start_services(layout, flags("worker", "--model", str(model), *tensor_parallel, *worker_args),
                               flags("scheduler", *scheduler_args),
                               [flags("router", *(["--model", str(model)] if router_args is None else router_args))],
                               env)
    services = None
    try:
        wait_until_serving(layout.router_address, "sluice.v1.Generation", 300, processes)
        services = RunningServices(layout, processes, metrics_ports, collector, env)
        yield services
    finally:
        if services is not None:
            services.close()
        stop_services(processes)
        collector.close()


@contextmanager
def extra_router(services: RunningServices, model: Path, *args: str, schedulers: str | None = None):
    """One more router process on the running scheduler, or on `schedulers` (a router starts in about a second)."""
    address = f"127.0.0.1:{free_port()}"
    command = [*sluice_command(), "router", "--listen", address,
               "--scheduler", schedulers or services.layout.scheduler_address, "--model", str(model), *args]
    process = subprocess.Popen(command, env=services.env)
    try:
        wait_until_serving(address, "sluice.v1.Generation", 60, [process])
        yield process, address
    finally:
        stop_services([process])


def health_status(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return health_pb2_grpc.HealthStub(channel).Check(request, timeout=2).status


def wait_for_health(address: str, service: str, status: int, timeout: float = 30.0) -> None:
    """Also waits for the server to listen."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if health_status(address, service) == status:
                return
        except grpc.RpcError:
            pass
        assert time.monotonic() < deadline, f"{service!r} at {address} never reported status {status}"
        time.sleep(0.1)


def stream_to_its_end(client: SluiceClient, request, started: threading.Semaphore, codes: list) -> None:
    """Reads the request's stream to its end: releases `started` at the first response, then appends how it ended."""
    stream = client.stream(request)
    try:
        next(stream)
        started.release()
        for _ in stream:
            pass
        codes.append(grpc.StatusCode.OK)
    except grpc.RpcError as error:
        codes.append(error.code())


def wait_for_serve(serve: subprocess.Popen) -> None:
    """Until `sluice serve` (its stdout a text pipe) has seen every router serve: a service that exits before then
    fails the start instead of being started again."""
    assert any("is serving" in line for line in serve.stdout), "sluice serve exited before it served"


def generate_once_served(client: SluiceClient, request, timeout: float) -> list[int]:
    """The request's tokens, asked again while the stack answers UNAVAILABLE (a service restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.generate(request).token_ids
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, error
            time.sleep(0.2)


def rank_process(group: subprocess.Popen, rank: int) -> psutil.Process:
    """The process of `rank` among the ranks that a `sluice worker` of several started."""
    return next(p for p in psutil.Process(group.pid).children()
                if "--rank" in p.cmdline() and p.cmdline()[p.cmdline().index("--rank") + 1] == str(rank))
