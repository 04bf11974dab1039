"""How `sluice serve` stops: on its first SIGTERM, SIGINT or SIGHUP it stops its services in stages (the gateway, the
routers, the scheduler, the worker), each signalled once the stage in front of it has exited, so the streams in flight
finish within the drain timeout while everything behind them still serves. A second signal kills them all at once."""
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable

from sluice.cli.launcher import KeptService

log = logging.getLogger("sluice.serve")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_POLL_SECONDS = 0.2
_STAGE_GRACE_SECONDS = 10.0  # beyond the drain timeout: a service closing its server, a worker stopping its ranks


class StopRequested(Exception):
    """The first stop signal, raised where `sluice serve` waits for its services to start."""


class StopSignals:
    """Counts the stop signals that reach `sluice serve` from now on (one ignored so far, as nohup ignores SIGHUP,
    stays ignored). The first raises StopRequested inside `interrupting()` and elsewhere only sets `requested`, so
    it never lands in the middle of starting a process; a later one sets `forced`."""

    def __init__(self):
        self.count = 0
        self._interrupting = False
        for stop_signal in _STOP_SIGNALS:
            if signal.getsignal(stop_signal) is not signal.SIG_IGN:
                signal.signal(stop_signal, self._on_signal)

    @property
    def requested(self) -> bool:
        return self.count > 0

    @property
    def forced(self) -> bool:
        return self.count > 1

    def _on_signal(self, signum: int, frame) -> None:
        self.count += 1
        log.info("%s: %s", signal.Signals(signum).name,
                 "stopping the services in order" if self.count == 1 else "killing the services")
        if self.count == 1 and self._interrupting:
            raise StopRequested

    @contextlib.contextmanager
    def interrupting(self):
        self._interrupting = True
        try:
            if self.requested:
                raise StopRequested
            yield
        finally:
            self._interrupting = False


def stop_in_stages(stages: list[list[KeptService]], drain_timeout: float, forced: Callable[[], bool]) -> bool:
    """SIGTERM to the running services of each stage once every service of the stage before has exited; one still
    running _STAGE_GRACE_SECONDS after its drain timeout is killed, and once forced() every one left is. Each
    service's process leads a process group (a session of its own), killed with it. True if every service stopped on
    its own with exit code 0."""
    stage_timeout = drain_timeout + _STAGE_GRACE_SECONDS
    clean = True
    for stage in stages:
        running = [service for service in stage if service.process.poll() is None]
        for service in running:
            service.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stage_timeout
        while any(s.process.poll() is None for s in running) and time.monotonic() < deadline and not forced():
            time.sleep(_POLL_SECONDS)
        if forced():
            _kill_groups([service for stage in stages for service in stage])
            return False
        for service in running:
            if service.process.poll() is None:
                log.error("the %s did not stop within %.0f s; killing it", service.name, stage_timeout)
            elif service.process.returncode != 0:
                log.error("the %s exited with code %d", service.name, service.process.returncode)
        _kill_groups(running)
        clean = clean and all(service.process.returncode == 0 for service in running)
    return clean


def _kill_groups(services: list[KeptService]) -> None:
    """Kills the process group of each service still running (the id of one that exited may be taken again)."""
    for service in services:
        if service.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, signal.SIGKILL)
            service.process.kill()
            service.process.wait()
