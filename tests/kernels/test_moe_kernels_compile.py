"""The MoE kernels compile for the H200 on any machine at the launch configs Qwen3-30B-A3B gets (bf16, float32, and FP8
with a scale per row or per 128 x 128 block; 4-bit in groups of 128 with zero points and act-order, sorted by group
or each row naming its group; bf16 with gpt-oss's biases and clamped SwiGLU): the grouped GEMMs' K loops
software-pipelined within the 227 KiB of shared memory a block may use, and nothing spills registers. The
interpreter that runs the other kernel tests on the CPU checks none of this."""
import re

from tests.kernels.sm90_compile import compiled_lines

MAX_SHARED = 227 * 1024  # H100 and H200: dynamic shared memory per block


def test_moe_kernels_compile_for_the_h200():
    lines = compiled_lines("moe_h200_compile.py")
    assert len(lines) == 38 and all("no spills" in line for line in lines), lines
    gemms = [line for line in lines if line.startswith(("moe gate_up", "moe down"))]
    assert len(gemms) == 32 and all(", pipelined," in line for line in gemms), lines
    assert max(int(re.search(r": (\d+) bytes", line).group(1)) for line in lines) <= MAX_SHARED
