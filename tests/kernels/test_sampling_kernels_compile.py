"""The sampling and logprob kernels compile for the H200 on any machine, the draw and the search without spilling
registers: the interpreter that runs the other kernel tests on the CPU accepts some programs that the compiler
refuses."""
import os
import subprocess
import sys
from pathlib import Path


def test_sampling_and_logprob_kernels_compile_for_the_h200():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "tests.kernels.h200_compile"], capture_output=True, text=True,
                            env=env, cwd=Path(__file__).parents[2], timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 16 and all("bytes of PTX" in line for line in lines)
    assert not [line for line in lines if "spills" in line and "no spills" not in line]
