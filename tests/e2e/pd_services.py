"""A disaggregated stack as `sluice serve --pd` lays it out (a prefill replica, a decode replica and a router pairing
them), each scheduler's metrics on a port of its own; and a stand-in for the router on one scheduler's stream, to
send one leg of a disaggregated request by hand."""
import queue
import signal
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from sluice.cli.launcher import ServeLayout, free_ports, start_services, stop_services, wait_until_serving
from sluice.client import SluiceClient, scheduler_load
from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.e2e.services import extra_router


class PdServices:
    def __init__(self, layout: ServeLayout, processes, metrics_ports: dict[str, int], env: dict[str, str] | None):
        self.layout = layout
        self.processes = processes
        self.decode_worker, self.decode_scheduler, self.router, self.prefill_worker, self.prefill_scheduler = processes
        self.metrics_ports = metrics_ports  # "prefill", "decode" -> its scheduler's port
        self.addresses = {"prefill": layout.prefill_scheduler_address, "decode": layout.scheduler_address}
        self.client = SluiceClient(layout.router_address)
        self.env = env  # the services' environment; None: the test's own

    def load(self, side: str) -> scheduler_pb2.Load:
        return scheduler_load(self.addresses[side])

    def metric(self, side: str, name: str) -> float:
        return scraped(self.metrics_ports[side], name)

    def wait_until_settled(self, timeout: float = 20.0) -> None:
        """Until both replicas run nothing and hold every block free again (no lease, no pin, no request)."""
        deadline = time.monotonic() + timeout
        while True:
            loads = [self.load(side) for side in ("prefill", "decode")]
            if all(load.num_free_blocks == load.num_total_blocks and not load.num_running for load in loads):
                return
            assert time.monotonic() < deadline, f"blocks not back: {loads}"
            time.sleep(0.05)

    def wait_until_pulling(self) -> None:
        """Until the decode replica has reserved the blocks of one pull and asked its worker to read them."""
        def pulling() -> bool:
            load = self.load("decode")
            return self.metric("decode", "sluice:kv_pulls") == 1 and load.num_free_blocks < load.num_total_blocks

        wait_for(pulling)

    @contextmanager
    def decode_worker_stopped(self):
        """The decode worker stopped (SIGSTOP) until the block ends: a decode leg's pull waits for it meanwhile."""
        self.decode_worker.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.decode_worker.send_signal(signal.SIGCONT)

    def restart(self, process: subprocess.Popen) -> subprocess.Popen:
        """A new process in place of one of the services' that exited, with its arguments (so at its address)."""
        index = self.processes.index(process)
        self.processes[index] = subprocess.Popen(process.args, env=self.env)
        return self.processes[index]

    @contextmanager
    def side_router(self, side: str, model: Path | str, *args: str):
        """The address of a router of one replica alone: it serves plain requests as a replica of its own, and
        legs of disaggregated ones that a gateway pairs (kv_transfer_params_json)."""
        with extra_router(self, model, *args, schedulers=self.addresses[side]) as (_, address):
            yield address


def wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def scraped(port: int, name: str) -> float:
    """The sample of the series `name` (a counter's _total, a histogram's _count, as named) on a metrics port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name)


@contextmanager
def running_pd_services(model: Path | str, scheduler_args: list[str] = (), worker_args: list[str] = (),
                        router_args: list[str] | None = None, tensor_parallel_size: int = 1,
                        env: dict[str, str] | None = None):
    """env: the services' environment (default: this process's)."""
    layout = ServeLayout.on_free_ports(num_ranks=tensor_parallel_size, pd=True)
    prefill_metrics, decode_metrics = free_ports(2)
    tensor_parallel = ["--tensor-parallel-size", str(tensor_parallel_size)] if tensor_parallel_size > 1 else []
    workers = ["--model", str(model), *tensor_parallel, *worker_args]
    processes = start_services(layout, workers, [*scheduler_args, "--metrics-port", str(decode_metrics)],
                               [["--model", str(model)] if router_args is None else router_args], env,
                               prefill_args=(workers, [*scheduler_args, "--metrics-port", str(prefill_metrics)]))
    services = None
    try:
        wait_until_serving(layout.router_address, "sluice.v1.Generation", 300, processes)
        services = PdServices(layout, processes, {"prefill": prefill_metrics, "decode": decode_metrics}, env)
        yield services
    finally:
        if services is not None:
            services.client.close()
        stop_services(processes)


class SchedulerStream:
    """One router's stream to a scheduler, driven by hand: submit a request (a leg), read its ending."""

    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address)
        self._outgoing: queue.Queue = queue.Queue()
        self._replies = scheduler_pb2_grpc.SchedulerStub(self.channel).Connect(iter(self._outgoing.get, None))

    def submit(self, request_id: str, prompt_ids: list[int], max_tokens: int,
               kv_transfer: scheduler_pb2.KvTransferParams) -> None:
        sampling = generation_pb2.SamplingParams(max_tokens=max_tokens, temperature=0.0)
        self._outgoing.put(scheduler_pb2.RouterMessage(submit=scheduler_pb2.Submit(
            request_id=request_id, prompt_token_ids=prompt_ids, sampling=sampling, kv_transfer=kv_transfer)))

    def ending(self, request_id: str) -> scheduler_pb2.Finished | scheduler_pb2.Rejection:
        for message in self._replies:
            for ending in (*message.step.finished, *message.step.rejections):
                if ending.request_id == request_id:
                    return ending
        raise AssertionError("the scheduler closed the stream")

    def close(self) -> None:
        self._outgoing.put(None)
        self.channel.close()
