"""The W4A16 GEMM and decode kernels compile for the H200 on any machine at the launch configs Llama-3.1-8B's rows
get (1 and 8 rows: the decode kernel; 16, 64 and 4096: the GEMM), symmetric, with zero points and with act-order
(sorted by group, or each row naming its group): their K loops software-pipelined within the 227 KiB of shared
memory a block may use, and nothing spills registers. The interpreter that runs the other kernel tests on the CPU
checks none of this."""
import re

from tests.kernels.sm90_compile import compiled_lines

MAX_SHARED = 227 * 1024  # H100 and H200: dynamic shared memory per block


def test_w4a16_kernels_compile_for_the_h200():
    lines = compiled_lines("w4a16_h200_compile.py")
    assert len(lines) == 20 and all(line.endswith(", pipelined, no spills") for line in lines), lines
    assert sum(line.startswith("w4a16 decode") for line in lines) == 8
    assert max(int(re.search(r": (\d+) bytes", line).group(1)) for line in lines) <= MAX_SHARED
