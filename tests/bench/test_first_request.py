"""benchmarks/first_request.py on the CPU (the torch path), with a tiny model of random weights: both stacks start,
serve every sampling variant's first request and report their start-up with the sampler warm-up in it."""
import re
import subprocess
import sys

import pytest

from tests.scripts import ROOT, load_script

SCRIPT = ROOT / "benchmarks" / "first_request.py"


@pytest.mark.slow
def test_both_stacks_serve_every_variant_and_report_their_start_up():
    run = subprocess.run([sys.executable, str(SCRIPT), "--max-tokens", "2", "--load-format", "dummy", "--model",
                          "SmolLM2-tiny", "--kv-cache-gib", "0.05"], check=True, capture_output=True, text=True,
                         timeout=600)
    for name in load_script(SCRIPT).VARIANTS:
        assert re.search(rf"^{re.escape(name)} +\d+\.\d ms +\d+\.\d ms +\d+\.\d\d$", run.stdout, re.MULTILINE), \
            run.stdout
    warm_ups = re.findall(r"^start-up, (cold|warm) cache: [\d.]+ s, of which the sampler warm-up ([\d.]+) s",
                          run.stdout, re.MULTILINE)
    assert [cache for cache, _ in warm_ups] == ["cold", "warm"] and all(float(s) > 0 for _, s in warm_ups)
