"""`sluice serve`: starts worker, scheduler and router processes, waits until every router is ready, and starts
again each one that exits (serve_stop stops them)."""
import logging
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.cli.python_command import sluice_command, sluice_subcommand

log = logging.getLogger("sluice.serve")
_POLL_SECONDS = 0.2
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST_PICKED_PORT = 20000
_HANDED_OUT: set[int] = set()


@dataclass(slots=True)
class ServeLayout:
    host: str
    router_port: int
    scheduler_port: int
    worker_ports: list[int]  # one per rank of the replica (tensor-parallel ranks of each pipeline stage), in order
    router_own_ports: list[int] = field(default_factory=list)  # one per router process where several share the port
    # `sluice serve --pd`: a prefill replica's scheduler and worker ranks (the replica above decodes); 0 and none else
    prefill_scheduler_port: int = 0
    prefill_worker_ports: list[int] = field(default_factory=list)

    @classmethod
    def on_free_ports(cls, host: str = "127.0.0.1", router_port: int | None = None,
                      num_ranks: int = 1, router_processes: int = 1, pd: bool = False) -> "ServeLayout":
        num_own = router_processes if router_processes > 1 else 0
        num_prefill = 1 + num_ranks if pd else 0
        free_router_port, scheduler_port, *ports = free_ports(2 + num_ranks + num_own + num_prefill, host)
        prefill = ports[num_ranks + num_own:]
        return cls(host, router_port or free_router_port, scheduler_port, ports[:num_ranks],
                   ports[num_ranks:num_ranks + num_own], *(prefill[:1] or [0]), prefill[1:])

    @property
    def router_address(self) -> str:
        return f"{self.host}:{self.router_port}"

    @property
    def router_processes(self) -> int:
        return len(self.router_own_ports) or 1

    @property
    def router_listens(self) -> list[str]:
        """Each router process's --listen: the router port, and where several share it, a loopback port of its own
        (where the launcher sees that process ready)."""
        if not self.router_own_ports:
            return [self.router_address]
        return [f"{self.router_address},{own}" for own in self.router_process_addresses]

    @property
    def router_names(self) -> list[str]:
        """"router", "router 2", ...: the router processes as reports name them."""
        return ["router"] + [f"router {i}" for i in range(2, self.router_processes + 1)]

    @property
    def router_process_addresses(self) -> list[str]:
        """One address per router process: its own port where several share the router port, else the router's."""
        return [f"127.0.0.1:{port}" for port in self.router_own_ports] or [self.router_address]

    @property
    def scheduler_address(self) -> str:
        return f"{self.host}:{self.scheduler_port}"

    @property
    def worker_addresses(self) -> str:
        """Comma-separated, in rank order: the worker's --listen and the scheduler's --worker."""
        return ",".join(f"{self.host}:{port}" for port in self.worker_ports)

    @property
    def prefill_scheduler_address(self) -> str:
        return f"{self.host}:{self.prefill_scheduler_port}"

    @property
    def prefill_worker_addresses(self) -> str:
        return ",".join(f"{self.host}:{port}" for port in self.prefill_worker_ports)


def free_ports(count: int, host: str = "127.0.0.1", run: int = 1) -> list[int]:
    """Distinct ports that a service can still bind after a wait: they lie below the kernel's ephemeral range, so no
    outgoing connection takes one in the meantime (a port the kernel hands out for bind(0) is in that range and is
    free again the moment its socket closes). A port is handed out once per process: one picked earlier may not be
    bound yet. With `run` > 1, each port begins that many free ports in a row (a service whose ranks bind the port
    plus their rank)."""
    first_ephemeral = _first_ephemeral_port()
    candidates = [port for port in range(_LOWEST_PICKED_PORT, first_ephemeral - run + 1)
                  if _HANDED_OUT.isdisjoint(range(port, port + run))]
    random.shuffle(candidates)
    ports, taken = [], set()
    for port in candidates:
        block = range(port, port + run)
        if taken.intersection(block) or not all(_bindable(host, p) for p in block):
            continue
        ports.append(port)
        taken.update(block)
        if len(ports) == count:
            _HANDED_OUT.update(taken)
            return ports
    raise OSError(f"fewer than {count} runs of {run} free ports on {host} below {first_ephemeral}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _first_ephemeral_port() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def wait_until_serving(address: str, service: str, timeout: float, processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            dead = [p for p in processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{sluice_subcommand(dead[0].args)} exited with code {dead[0].returncode}")
            try:
                status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(_POLL_SECONDS)
    raise TimeoutError(f"{service} at {address} not serving after {timeout:.0f} s")


def start_services(layout: ServeLayout, worker_args: list[str], scheduler_args: list[str],
                   router_args: list[list[str]], env: dict[str, str] | None = None, own_sessions: bool = False,
                   prefill_args: tuple[list[str], list[str]] = ([], [])) -> list[subprocess.Popen]:
    """Worker, scheduler, then the routers (start_routers), and where the layout has a prefill replica, its worker
    and scheduler (prefill_args: their own arguments) with --kv-role prefill, the first two with --kv-role decode.
    env: the services' environment (default: this process's). own_sessions: each service in a session (and process
    group) of its own, out of reach of the terminal's Ctrl-C, which then reaches only this process (`sluice serve`,
    which stops them in order)."""
    popen = {"env": env, "start_new_session": own_sessions}
    role = ["--kv-role", "decode"] if layout.prefill_scheduler_port else []
    processes = [*_start_replica(layout.worker_addresses, layout.scheduler_address, [*worker_args, *role],
                                 [*scheduler_args, *role], popen),
                 *start_routers(layout, router_args, env, own_sessions)]
    if layout.prefill_scheduler_port:
        role = ["--kv-role", "prefill"]
        processes += _start_replica(layout.prefill_worker_addresses, layout.prefill_scheduler_address,
                                    [*prefill_args[0], *role], [*prefill_args[1], *role], popen)
    return processes


def _start_replica(worker_addresses: str, scheduler_address: str, worker_args: list[str], scheduler_args: list[str],
                   popen: dict) -> list[subprocess.Popen]:
    return [subprocess.Popen(sluice_command("worker", "--listen", worker_addresses, *worker_args), **popen),
            subprocess.Popen(sluice_command("scheduler", "--listen", scheduler_address, "--worker", worker_addresses,
                                            *scheduler_args), **popen)]


def start_routers(layout: ServeLayout, router_args: list[list[str]], env: dict[str, str] | None = None,
                  own_sessions: bool = False) -> list[subprocess.Popen]:
    """One router per layout.router_listens, with its router_args; several share the router port."""
    if len(router_args) != layout.router_processes:
        raise ValueError(f"{len(router_args)} router argument lists for {layout.router_processes} router processes")
    placed = ["--share-port"] if layout.router_processes > 1 else []
    if layout.prefill_scheduler_port:
        placed += ["--prefill-scheduler", layout.prefill_scheduler_address]
    return [subprocess.Popen([*sluice_command("router"), "--listen", listen, *placed,
                              "--scheduler", layout.scheduler_address, *args], env=env,
                             start_new_session=own_sessions)
            for listen, args in zip(layout.router_listens, router_args)]


def wait_until_routers_serve(layout: ServeLayout, timeout: float, processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    for address in layout.router_process_addresses:
        wait_until_serving(address, "sluice.v1.Generation", max(0.0, deadline - time.monotonic()), processes)


@dataclass(slots=True)
class RestartBackoff:
    first_delay: float = 1.0  # seconds between a service's exit and its restart
    max_delay: float = 30.0  # the delay doubles, up to this, while the service keeps exiting soon after it starts
    settled_after: float = 60.0  # a service that ran this long exited on its own: the delay starts over


class KeptService:
    """A service's process, started again with its command line (in a session of its own, as `sluice serve` starts
    each) whenever it exits, after a backoff delay."""

    def __init__(self, process: subprocess.Popen, backoff: RestartBackoff, name: str | None = None):
        """name: for the log (default: the Sluice service the command runs)."""
        self.process = process
        self.backoff = backoff
        self._name = name
        self._started = time.monotonic()
        self._delay = backoff.first_delay
        self._restart_at: float | None = None

    @property
    def name(self) -> str:
        return self._name or sluice_subcommand(self.process.args)

    def poll(self, now: float) -> None:
        if self._restart_at is None:
            if self.process.poll() is None:
                return
            if now - self._started >= self.backoff.settled_after:
                self._delay = self.backoff.first_delay
            log.error("the %s exited with code %d; starting it again in %.0f s", self.name, self.process.returncode,
                      self._delay)
            self._restart_at = now + self._delay
            self._delay = min(2 * self._delay, self.backoff.max_delay)
        elif now >= self._restart_at:
            self.process = subprocess.Popen(self.process.args, start_new_session=True)
            self._started, self._restart_at = now, None


def keep_running(services: list[KeptService], until: Callable[[], bool]) -> None:
    while not until():
        now = time.monotonic()
        for service in services:
            service.poll(now)
        time.sleep(_POLL_SECONDS)


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
