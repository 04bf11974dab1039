"""The norm, gate, q/k/v and one-row linear kernels compile for the H200 on any machine in their Gemma variants (and
Llama's beside them) at Gemma-3-4B's shapes, without spilling registers: the interpreter that runs the other kernel
tests on the CPU accepts some programs that the compiler refuses."""
import os
import subprocess
from pathlib import Path

from sluice.cli.python_command import python_command


def test_gemma_kernel_variants_compile_for_the_h200():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("gemma_h200_compile.py")
    result = subprocess.run(python_command(str(script)), capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 18 and all(line.endswith("no spills") for line in lines), result.stdout
    assert sum("gemma" in line or "gelu_tanh" in line for line in lines) == 9
