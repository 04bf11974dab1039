"""The sampling and logprob kernels compile for the H200 on any machine, the draw and the search without spilling
registers: the interpreter that runs the other kernel tests on the CPU accepts some programs that the compiler
refuses."""
from tests.kernels.sm90_compile import compiled_lines


def test_sampling_and_logprob_kernels_compile_for_the_h200():
    lines = compiled_lines("h200_compile.py")
    assert len(lines) == 16 and all("bytes of PTX" in line for line in lines)
    assert not [line for line in lines if "spills" in line and "no spills" not in line]
