"""The norm, gate, q/k/v and one-row linear kernels compile for the H200 on any machine in their Gemma variants (and
Llama's beside them) at Gemma-3-4B's shapes, without spilling registers: the interpreter that runs the other kernel
tests on the CPU accepts some programs that the compiler refuses."""
from tests.kernels.sm90_compile import compiled_lines


def test_gemma_kernel_variants_compile_for_the_h200():
    lines = compiled_lines("gemma_h200_compile.py")
    assert len(lines) == 18 and all(line.endswith("no spills") for line in lines), lines
    assert sum("gemma" in line or "gelu_tanh" in line for line in lines) == 9
