"""Compiles the MoE kernels for the H200 (sm_90) with Triton's own ptxas, no GPU needed, at the launch configs
kernels.fused_moe picks for Qwen3-30B-A3B's experts, and prints one line per variant: shared memory, whether the
GEMM's K loop is software-pipelined (asynchronous copies) and whether registers spill:
`python tests/kernels/moe_h200_compile.py` (without TRITON_INTERPRET).

Arguments are typed as a launch types them: pointers and the integers that are multiples of 16 carry
tt.divisibility 16, a weight's unit stride is the constant 1; without the divisibility the loads cannot be
vectorised and the compiler does not pipeline them.
"""
import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sluice.kernels.fp8_quant import FP8
from sluice.kernels.fused_moe import SPARSE_STEP, _moe_down_kernel, _moe_gate_up_kernel, moe_launch_config
from sluice.kernels.moe_align import _moe_align_count_kernel, _moe_align_kernel
from sluice.kernels.moe_routing import _topk_softmax_kernel

H200 = GPUTarget("cuda", 90, 32)
UNALIGNED = {"num_pairs", "num_blocks", "num_tokens", "num_experts", "num_chunks", "max_blocks", "stride_as",
             "stride_se", "stride_sn", "stride_sk", "stride_pe", "stride_ge", "stride_be"}  # any value
SCALES = {"a_scale_ptr": "*fp32", "w_scale_ptr": "*fp32", "w_zero_ptr": "*u8", "perm_ptr": "*i32",
          "group_index_ptr": "*i32", "stride_as": "i32", "stride_se": "i32", "stride_sn": "i32", "stride_sk": "i32",
          "stride_pe": "i32", "stride_ge": "i32", "bias_ptr": "*bf16", "stride_be": "i32"}
GATE_UP = {"x_ptr": "*bf16", "w13_ptr": "*bf16", "h_ptr": "*bf16", "sorted_ids_ptr": "*i32",
           "block_experts_ptr": "*i32", "num_padded_ptr": "*i32", "num_pairs": "i32", "num_blocks": "i32",
           "hidden": "i32", "intermediate": "i32", "stride_xt": "i32", "stride_we": "i32", "stride_wn": "i32",
           "stride_ht": "i32"} | SCALES
DOWN = {"h_ptr": "*bf16", "w2_ptr": "*bf16", "topk_weights_ptr": "*fp32", "y_ptr": "*bf16", "sorted_ids_ptr": "*i32",
        "block_experts_ptr": "*i32", "num_padded_ptr": "*i32", "num_pairs": "i32", "num_blocks": "i32",
        "hidden": "i32", "intermediate": "i32", "stride_ht": "i32", "stride_we": "i32", "stride_wn": "i32",
        "stride_yt": "i32"} | SCALES
_NOT_INT4 = dict(INT4_GROUP=0, HAS_ZEROS=False, HAS_PERM=False, HAS_GROUP_INDEX=False)
# each precision's operands (activations and weights), and its scales' constexprs (a stride of 1 is one)
PRECISIONS = {
    "bf16": ("*bf16", dict(ROW_SCALES=False, GROUP_N=1, GROUP_K=0) | _NOT_INT4),
    "fp32": ("*fp32", dict(ROW_SCALES=False, GROUP_N=1, GROUP_K=0) | _NOT_INT4),
    "fp8 rows": ("*fp8e4nv", dict(ROW_SCALES=True, GROUP_N=1, GROUP_K=0, stride_as=1, stride_sn=1) | _NOT_INT4),
    "fp8 blocks": ("*fp8e4nv", dict(ROW_SCALES=False, GROUP_N=128, GROUP_K=128, stride_sk=1) | _NOT_INT4),
    "int4": ("*bf16", dict(ROW_SCALES=False, GROUP_N=1, GROUP_K=0, INT4_GROUP=128, HAS_ZEROS=True, HAS_PERM=True,
                           HAS_GROUP_INDEX=False, stride_sn=1)),
    # a rank's share of act-order experts at -tp 2: each row's group looked up, a K slice anywhere in the 384 rows
    "int4 group_index": ("*bf16", dict(ROW_SCALES=False, GROUP_N=1, GROUP_K=0, INT4_GROUP=384, HAS_ZEROS=True,
                                       HAS_PERM=False, HAS_GROUP_INDEX=True, stride_sn=1)),
}
# 4-bit experts (kernels.w4a16_layout.W4A16Stack): int32 words along K, N contiguous; bf16 scales, uint8 zero points
INT4_WEIGHTS = {"w_scale_ptr": "*bf16", "stride_wk": "i32"}
ROUTE = {"logits_ptr": "*bf16", "weights_ptr": "*fp32", "ids_ptr": "*i32", "num_tokens": "i32", "num_experts": "i32",
         "stride_l": "i32"}
ALIGN = {"topk_ids_ptr": "*i32", "expert_map_ptr": "*i32", "counts_ptr": "*i32", "sorted_ids_ptr": "*i32",
         "block_experts_ptr": "*i32", "num_padded_ptr": "*i32", "num_pairs": "i32", "num_experts": "i32",
         "num_chunks": "i32", "max_blocks": "i32"}
COUNT = {"topk_ids_ptr": "*i32", "expert_map_ptr": "*i32", "counts_ptr": "*i32", "num_pairs": "i32",
         "num_experts": "i32"}


def compile_h200(kernel, signature: dict[str, str], constexprs: dict, num_warps: int, num_stages: int = 3):
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]]
             for name in signature if name not in UNALIGNED}
    source = ASTSource(kernel, signature | dict.fromkeys(constexprs, "constexpr"), constexprs, attrs=attrs)
    return triton.compile(source, target=H200, options={"num_warps": num_warps, "num_stages": num_stages})


def describe(name: str, compiled) -> str:
    pipelined = "pipelined" if "async_copy_global_to_local" in compiled.asm["ttgir"] else "not pipelined"
    spills = "spills to local memory" if ".local" in compiled.asm["ptx"] else "no spills"
    return f"{name}: {compiled.metadata.shared} bytes of shared memory, {pipelined}, {spills}"


def gemms(num_tokens: int, precision: str, gpt_oss: bool = False) -> list[str]:
    """Both grouped GEMMs at the config picked for num_tokens of Qwen3-30B-A3B (128 experts, top-8, H 2048, I 768),
    of a precision of PRECISIONS: bf16 or fp32 weights and activations, or e4m3 ones with a scale per row or per
    128 x 128 block (Qwen3-30B-A3B-FP8's), or 4-bit ones in groups of 128 with zero points and act-order, sorted by
    group or (a tensor-parallel rank's share) each row naming its group (bf16 activations); the outputs in bf16
    (float32 for float32). gpt_oss: with expert biases and the clamped SwiGLU."""
    operands, scales = PRECISIONS[precision]
    dtype = {"*bf16": torch.bfloat16, "*fp32": torch.float32, "*fp8e4nv": FP8}[operands]
    int4 = precision.startswith("int4")
    config = moe_launch_config(num_tokens, 8, 128, 2048, 768, dtype, torch.device("cuda"))
    dot = {torch.float32: (tl.float32, "ieee"), torch.bfloat16: (tl.bfloat16, "tf32"), FP8: (tl.float8e4nv, "tf32")}
    output = "*fp32" if precision == "fp32" else "*bf16"
    common = dict(BLOCK_M=config["BLOCK_M"], BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"], EVEN_K=True,
                  DOT_DTYPE=dot[dtype][0], DOT_PRECISION=dot[dtype][1], PDL=True,
                  ONE_PAIR_EACH=num_tokens * 8 * SPARSE_STEP <= 128) | scales
    options = dict(num_warps=config["num_warps"], num_stages=config["num_stages"])
    tile = f"{config['BLOCK_M']}x{config['BLOCK_N']}x{config['BLOCK_K']}" + (" gpt-oss" if gpt_oss else "")
    swiglu = dict(SWIGLU_ALPHA=1.702, SWIGLU_LIMIT=7.0) if gpt_oss else dict(SWIGLU_ALPHA=0.0, SWIGLU_LIMIT=0.0)
    weights = "*i32" if int4 else operands
    unit_stride = dict(stride_wn=1) if int4 else dict(stride_wk=1)  # N contiguous for 4-bit words, else K
    lines = []
    for name, kernel, signature, types, extra in (
        ("gate_up", _moe_gate_up_kernel, GATE_UP, {"x_ptr": operands, "w13_ptr": weights, "h_ptr": output},
         dict(TOP_K=8, BLOCK_N=config["BLOCK_N"] // 2) | swiglu),
        ("down", _moe_down_kernel, DOWN, {"h_ptr": operands, "w2_ptr": weights, "y_ptr": output},
         dict(BLOCK_N=config["BLOCK_N"])),
    ):
        if int4:
            signature = {key: kind for key, kind in signature.items() if key != "stride_wn"} | INT4_WEIGHTS
        constexprs = common | unit_stride | extra | dict(HAS_BIAS=gpt_oss)
        compiled = compile_h200(kernel, signature | types, constexprs, **options)
        lines.append(describe(f"moe {name} {num_tokens} tokens {precision} {tile}", compiled))
    return lines


def main() -> None:
    for num_tokens in (1, 64, 256, 512, 4096):
        print("\n".join(gemms(num_tokens, "bf16")))
    print("\n".join(gemms(4096, "fp32")))
    for num_tokens in (1, 4096):
        print("\n".join(gemms(num_tokens, "fp8 rows") + gemms(num_tokens, "fp8 blocks") + gemms(num_tokens, "int4")
                        + gemms(num_tokens, "int4 group_index")))
        print("\n".join(gemms(num_tokens, "bf16", gpt_oss=True)))
    for experts, top_k, block_t in ((128, 8, 32), (512, 8, 8)):
        constexprs = dict(TOP_K=top_k, RENORMALIZE=True, BLOCK_T=block_t, BLOCK_E=experts, BLOCK_K=top_k, PDL=True)
        print(describe(f"topk_softmax {experts} experts", compile_h200(_topk_softmax_kernel, ROUTE, constexprs, 4)))
    for one_chunk, chunk, experts, block_m in ((True, 16, 128, 16), (False, 128, 128, 128), (False, 32, 512, 64)):
        constexprs = dict(HAS_MAP=True, ONE_CHUNK=one_chunk, CHUNK=chunk, BLOCK_E=experts, BLOCK_M=block_m,
                          TABLE_ROWS=1 if one_chunk else 64, LABEL_BLOCKS=16, PDL=True)
        compiled = compile_h200(_moe_align_kernel, ALIGN, constexprs, 8 if chunk * experts >= 8192 else 4)
        print(describe(f"moe_align chunk {chunk} of {experts} experts, blocks of {block_m}", compiled))
    compiled = compile_h200(_moe_align_count_kernel, COUNT, dict(HAS_MAP=False, CHUNK=128, BLOCK_E=128, PDL=True), 4)
    print(describe("moe_align count", compiled))


if __name__ == "__main__":
    main()
