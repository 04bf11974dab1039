"""`sluice serve` stops its services in stages, each signalled once the one before has exited; a forced stop kills
every service with the processes it started."""
import subprocess
import sys

import psutil

from sluice.cli.launcher import KeptService, RestartBackoff
from sluice.cli.serve_stop import stop_in_stages

_ON_SIGTERM = """
import signal, sys, time
def stop(*_):
    print(time.monotonic(), flush=True)
    time.sleep({delay})
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""
_STARTS_A_CHILD_AND_IGNORES_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]).pid, flush=True)
time.sleep(60)
"""


def _service(name: str, code: str) -> tuple[KeptService, str]:
    """The service once its code has printed its first line (it has set its SIGTERM handler), and that line."""
    process = subprocess.Popen([sys.executable, "-c", code, "sluice.cli", name], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    return KeptService(process, RestartBackoff()), process.stdout.readline()


def test_each_stage_is_signalled_once_the_one_before_has_exited():
    router, _ = _service("router", _ON_SIGTERM.format(delay=1.0))
    (scheduler, _), (worker, _) = (_service(name, _ON_SIGTERM.format(delay=0.0)) for name in ("scheduler", "worker"))
    assert stop_in_stages([[router], [scheduler], [worker]], drain_timeout=5.0, forced=lambda: False)
    router_signalled, scheduler_signalled, worker_signalled = (float(service.process.stdout.read())
                                                               for service in (router, scheduler, worker))
    assert router_signalled + 1.0 <= scheduler_signalled <= worker_signalled


def test_a_forced_stop_kills_every_service_with_the_processes_it_started():
    router, child_pid = _service("router", _STARTS_A_CHILD_AND_IGNORES_SIGTERM)
    child = psutil.Process(int(child_pid))
    worker, _ = _service("worker", _ON_SIGTERM.format(delay=0.0))
    assert not stop_in_stages([[router], [worker]], drain_timeout=60.0, forced=lambda: True)
    assert router.process.returncode == worker.process.returncode == -9
    child.wait(timeout=5)
