"""`sluice serve`: starts worker, scheduler and router as three processes and waits until the router is ready."""
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass(slots=True)
class ServeLayout:
    host: str
    router_port: int
    scheduler_port: int
    worker_port: int

    @property
    def router_address(self) -> str:
        return f"{self.host}:{self.router_port}"

    @property
    def scheduler_address(self) -> str:
        return f"{self.host}:{self.scheduler_port}"

    @property
    def worker_address(self) -> str:
        return f"{self.host}:{self.worker_port}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_until_serving(address: str, service: str, timeout: float, processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            dead = [p for p in processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{' '.join(dead[0].args[3:5])} exited with code {dead[0].returncode}")
            try:
                status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError(f"{service} at {address} not serving after {timeout:.0f} s")


def start_services(layout: ServeLayout, worker_args: list[str], scheduler_args: list[str],
                   router_args: list[str], env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """env: the services' environment (default: this process's)."""
    command = [sys.executable, "-m", "sluice.cli"]
    return [
        subprocess.Popen([*command, "worker", "--listen", layout.worker_address, *worker_args], env=env),
        subprocess.Popen([*command, "scheduler", "--listen", layout.scheduler_address,
                          "--worker", layout.worker_address, *scheduler_args], env=env),
        subprocess.Popen([*command, "router", "--listen", layout.router_address,
                          "--scheduler", layout.scheduler_address, *router_args], env=env),
    ]


def stop_services(processes: list[subprocess.Popen], timeout: float = 10.0) -> None:
    for process in reversed(processes):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
