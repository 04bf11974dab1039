"""Runs a script of this folder that compiles kernels for the H200 (sm_90) without a GPU, outside the interpreter
the other kernel tests run under, and returns the lines it printed (one per kernel variant)."""
import os
import subprocess
from pathlib import Path

from sluice.cli.python_command import python_command


def compiled_lines(script: str) -> list[str]:
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    path = Path(__file__).with_name(script)
    result = subprocess.run(python_command(str(path)), capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()
