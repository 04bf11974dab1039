"""`sluice serve` starts again a service that exits, waiting longer each time it exits soon after starting."""
import subprocess
import sys
import time

from sluice.cli.launcher import KeptService, RestartBackoff


def _exits_at_once() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)", "sluice.cli", "quitter"])


def _restarted(service: KeptService, now: float) -> bool:
    before = service.process
    service.process.wait()
    service.poll(now)
    return service.process is not before


def test_a_service_is_restarted_after_a_delay_that_doubles_while_it_keeps_exiting():
    start = time.monotonic()
    first = _exits_at_once()
    service = KeptService(first, RestartBackoff(first_delay=1.0, max_delay=3.0, settled_after=60.0))
    assert service.name == "quitter"
    assert not _restarted(service, start)  # seen exiting: restarts 1 s later
    assert not _restarted(service, start + 0.9)
    assert _restarted(service, start + 1.0)
    assert service.process.args == first.args
    assert not _restarted(service, start + 1.0)  # exited again at once: 2 s this time
    assert not _restarted(service, start + 2.9)
    assert _restarted(service, start + 3.0)
    assert not _restarted(service, start + 3.0)  # then at most 3 s
    assert not _restarted(service, start + 5.9)
    assert _restarted(service, start + 6.0)
    assert not _restarted(service, start + 66.0)  # it ran for a minute: back to 1 s
    assert not _restarted(service, start + 66.9)
    assert _restarted(service, start + 67.0)
    service.process.wait()
