"""Compiles the W4A16 kernels for the H200 (sm_90) with Triton's own ptxas, no GPU needed, at the launch configs
kernels.w4a16 picks for Llama-3.1-8B's rows (hidden 4096, intermediate 14336, groups of 128; the configs depend on
the rows only), and prints one line per variant (symmetric, with zero points, with act-order's permutation, and
with act-order's group index of a tensor-parallel rank's share): shared memory, whether the K loop is
software-pipelined (asynchronous copies) and whether registers spill: `python tests/kernels/w4a16_h200_compile.py`
(without TRITON_INTERPRET). Pointers, N, K and the strides carry tt.divisibility 16, as a launch types them; M does not.
"""
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sluice.kernels.w4a16 import _w4a16_decode_kernel, _w4a16_gemm_kernel, w4a16_launch_config

H200 = GPUTarget("cuda", 90, 32)
GROUP, K = 128, 14336
SIGNATURE = {"x_ptr": "*bf16", "qweight_ptr": "*i32", "scales_ptr": "*bf16", "zeros_ptr": "*u8", "perm_ptr": "*i32",
             "group_index_ptr": "*i32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
             "stride_x": "i32", "stride_out": "i32"}


def describe(name: str, compiled) -> str:
    pipelined = "pipelined" if "async_copy_global_to_local" in compiled.asm["ttgir"] else "not pipelined"
    spills = "spills to local memory" if ".local" in compiled.asm["ptx"] else "no spills"
    return f"{name}: {compiled.metadata.shared} bytes of shared memory, {pipelined}, {spills}"


def compiled(rows: int, zeros: bool, act_order: str | None):
    """act_order: None, "perm" (the rows sorted by group) or "group_index" (each row naming its group)."""
    group = K if act_order == "group_index" else GROUP  # a K slice may cross groups: any that divides K
    config = w4a16_launch_config(rows, 4096, K, group, torch.bfloat16, torch.device("cuda"))
    options = dict(num_warps=config.pop("num_warps"), num_stages=config.pop("num_stages", 3))
    decode = config.pop("decode")
    kernel = _w4a16_decode_kernel if decode else _w4a16_gemm_kernel
    constexprs = config | dict(HAS_ZEROS=zeros, HAS_PERM=act_order == "perm",
                               HAS_GROUP_INDEX=act_order == "group_index", HAS_BIAS=True, GROUP=group, PDL=True)
    if not decode:
        constexprs |= dict(DOT_DTYPE=tl.bfloat16, DOT_PRECISION="tf32")
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in SIGNATURE if name != "M"}
    source = ASTSource(kernel, SIGNATURE | dict.fromkeys(constexprs, "constexpr"), constexprs, attrs=attrs)
    tile = "x".join(str(config[name]) for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    name = f"w4a16 {'decode' if decode else 'gemm'} {rows} rows {tile} zeros {zeros} act_order {act_order}"
    return describe(name, triton.compile(source, target=H200, options=options))


def main() -> None:
    for rows in (1, 8, 16, 64, 4096):
        for zeros, act_order in ((False, None), (True, None), (True, "perm"), (True, "group_index")):
            print(compiled(rows, zeros, act_order))


if __name__ == "__main__":
    main()
