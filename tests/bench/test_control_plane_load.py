"""benchmarks/control_plane_load.py run for real: the router and scheduler over the modelled worker deliver every
token of the workload to the client."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.cli.bench.workload import random_workload

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "control_plane_load.py"


@pytest.mark.parametrize(("router_processes", "client_processes"), [(1, 1), (2, 2)])
def test_every_token_of_the_workload_reaches_the_client(router_processes, client_processes):
    run = subprocess.run([sys.executable, str(SCRIPT), "--num-requests", "8", "--speed", "4", "--router-processes",
                          str(router_processes), "--client-processes", str(client_processes)], check=True,
                         capture_output=True, text=True, timeout=300)
    expected = sum(r.max_tokens for r in random_workload(8, (100, 1024), (100, 1024), 151936, 0))
    assert re.search(rf"^speed 4.0: {expected} tokens;", run.stdout, re.MULTILINE), run.stdout
    assert "CPU per output token: worker" in run.stdout
    assert ("router 2 " in run.stdout) == (router_processes == 2)
