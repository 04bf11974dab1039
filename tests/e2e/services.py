"""Starts the three real services as subprocesses on loopback, as `sluice serve` does."""
from contextlib import contextmanager
from pathlib import Path

import grpc

from sluice.client import SluiceClient
from sluice.launcher import ServeLayout, free_port, start_services, stop_services, wait_until_serving
from sluice.v1 import scheduler_pb2, scheduler_pb2_grpc


class RunningServices:
    def __init__(self, layout: ServeLayout, processes):
        self.layout = layout
        self.processes = processes
        self.client = SluiceClient(layout.router_address)
        self._scheduler_channel = grpc.insecure_channel(layout.scheduler_address)
        self._scheduler = scheduler_pb2_grpc.SchedulerStub(self._scheduler_channel)

    def load(self) -> scheduler_pb2.Load:
        return self._scheduler.GetLoad(scheduler_pb2.GetLoadRequest())

    def close(self) -> None:
        self.client.close()
        self._scheduler_channel.close()


@contextmanager
def running_services(model: Path, scheduler_args: list[str] = (), worker_args: list[str] = ()):
    layout = ServeLayout("127.0.0.1", free_port(), free_port(), free_port())
    processes = start_services(layout, ["--model", str(model), *worker_args], list(scheduler_args),
                               ["--model", str(model)])
    services = None
    try:
        wait_until_serving(layout.router_address, "sluice.v1.Generation", 300, processes)
        services = RunningServices(layout, processes)
        yield services
    finally:
        if services is not None:
            services.close()
        stop_services(processes)
