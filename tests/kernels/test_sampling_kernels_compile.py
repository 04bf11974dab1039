"""The sampling and logprob kernels compile for the H200 on any machine, the draw and the search without spilling
registers: the interpreter that runs the other kernel tests on the CPU accepts some programs that the compiler
refuses."""
import os
import subprocess
from pathlib import Path

from sluice.cli.python_command import python_command


def test_sampling_and_logprob_kernels_compile_for_the_h200():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("h200_compile.py")
    result = subprocess.run(python_command(str(script)), capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 16 and all("bytes of PTX" in line for line in lines)
    assert not [line for line in lines if "spills" in line and "no spills" not in line]
