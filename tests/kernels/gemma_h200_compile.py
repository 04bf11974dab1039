"""Compiles the decoder layer's norm, gate, q/k/v and one-row linear kernels for the H200 (sm_90) with Triton's own
ptxas, no GPU needed, in Llama's and Gemma's variants at Gemma-3-4B's shapes (hidden 2560, intermediate 10240, 8 q
heads and 4 kv heads of 256, vocabulary 262144), and prints one line per variant:
`python tests/kernels/gemma_h200_compile.py` (without TRITON_INTERPRET)."""
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sluice.kernels.activation import _act_and_mul_fp8_kernel, _act_and_mul_kernel
from sluice.kernels.fp8_quant import whole_row_warps
from sluice.kernels.fused_linear import _fused_linear_kernel, _launch_config
from sluice.kernels.qkv_prepare import _prepare_qkv_kernel
from sluice.kernels.rms_norm import _rms_norm_kernel

H200 = GPUTarget("cuda", 90, 32)
HIDDEN, INTERMEDIATE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, VOCAB = 2560, 10240, 8, 4, 256, 262144
NORMS = {"llama": False, "gemma": True}
ACTIVATIONS = {"llama": "silu", "gemma": "gelu_tanh"}

RMS_NORM = {"x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "out_ptr": "*bf16",
            "residual_out_ptr": "*bf16", "scale_ptr": "*fp32", "rows": "i32", "stride_x": "i32", "stride_r": "i32",
            "stride_o": "i32", "stride_ro": "i32", "eps": "fp32", "min_scale": "fp32", "absmax_bound": "fp32"}
ACT_AND_MUL = {"x_ptr": "*bf16", "out_ptr": "*bf16", "stride_x": "i32", "stride_o": "i32"}
ACT_AND_MUL_FP8 = {"x_ptr": "*bf16", "out_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "rows": "i32", "stride_x": "i32",
                   "stride_o": "i32", "min_scale": "fp32", "absmax_bound": "fp32"}
PREPARE_QKV = {"qkv_ptr": "*bf16", "positions_ptr": "*i64", "cos_sin_ptr": "*fp32", "q_norm_weight_ptr": "*bf16",
               "k_norm_weight_ptr": "*bf16", "slot_mapping_ptr": "*i64", "q_out_ptr": "*bf16",
               "key_cache_ptr": "*bf16", "value_cache_ptr": "*bf16", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
               "stride_t": "i32", "stride_h": "i32", "stride_cs": "i32", "stride_kcb": "i32", "stride_kcs": "i32",
               "stride_kch": "i32", "stride_vcb": "i32", "stride_vcs": "i32", "stride_vch": "i32", "eps": "fp32"}
FUSED_LINEAR = {"x_ptr": "*bf16", "residual_ptr": "*bf16", "norm_weight_ptr": "*bf16", "w_ptr": "*bf16",
                "w_scale_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "residual_out_ptr": "*bf16",
                "N": "i32", "K": "i32", "eps": "fp32", "stride_w": "i32"}


def compiled_ptx(kernel, signature: dict[str, str], constexprs: dict, num_warps: int) -> str:
    source = ASTSource(kernel, signature | dict.fromkeys(constexprs, "constexpr"), constexprs)
    return triton.compile(source, target=H200, options={"num_warps": num_warps}).asm["ptx"]


def describe(name: str, ptx: str) -> str:
    return f"{name}: {len(ptx)} bytes of PTX, {'spills to local memory' if '.local' in ptx else 'no spills'}"


def main() -> None:
    block = triton.next_power_of_2(HIDDEN)
    for family, gemma_norm in NORMS.items():
        for residual, quantize in ((False, False), (True, False), (True, True)):
            constexprs = dict(HIDDEN=HIDDEN, BLOCK=block, HAS_RESIDUAL=residual, QUANTIZE=quantize,
                              GEMMA_NORM=gemma_norm)
            ptx = compiled_ptx(_rms_norm_kernel, RMS_NORM | ({"out_ptr": "*fp8e4nv"} if quantize else {}),
                               constexprs, whole_row_warps(block, fewest=1, most=16))
            print(describe(f"rms_norm {family} residual {residual} fp8 {quantize}", ptx))
    for family, activation in ACTIVATIONS.items():
        ptx = compiled_ptx(_act_and_mul_kernel, ACT_AND_MUL, dict(D=INTERMEDIATE, BLOCK=1024, ACTIVATION=activation), 4)
        print(describe(f"act_and_mul {activation}", ptx))
        fp8_block = triton.next_power_of_2(INTERMEDIATE)
        ptx = compiled_ptx(_act_and_mul_fp8_kernel, ACT_AND_MUL_FP8,
                           dict(D=INTERMEDIATE, BLOCK=fp8_block, ACTIVATION=activation), whole_row_warps(fp8_block))
        print(describe(f"act_and_mul_fp8 {activation}", ptx))
    for family, gemma_norm in NORMS.items():
        constexprs = dict(NUM_HEADS=NUM_HEADS, NUM_KV_HEADS=NUM_KV_HEADS, HEAD_DIM=HEAD_DIM, ROTARY_DIM=HEAD_DIM,
                          BLOCK_SIZE=16, BLOCK_H=NUM_HEADS, BLOCK_KV_H=NUM_KV_HEADS, BLOCK_D=HEAD_DIM, HAS_NORM=True,
                          GEMMA_NORM=gemma_norm, KV_FP8=False, PDL=True)
        ptx = compiled_ptx(_prepare_qkv_kernel, PREPARE_QKV, constexprs, NUM_HEADS * HEAD_DIM // 512)
        print(describe(f"prepare_qkv {family} q/k norms", ptx))
    projections = {"qkv": ((NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM, False), "gate_up": (INTERMEDIATE, True),
                   "lm_head": (VOCAB, False)}
    for family, gemma_norm in NORMS.items():
        for name, (n, gated) in projections.items():
            config = _launch_config(n, HIDDEN, True, False, torch.device("cuda"))
            constexprs = dict(NORM=True, GEMMA_NORM=gemma_norm, HAS_RESIDUAL=True, HAS_BIAS=False, GATED=gated,
                              ACTIVATION=ACTIVATIONS[family], HAS_W_SCALE=False, ONE_TILE=config["BLOCK_K"] >= HIDDEN,
                              EVEN_K=HIDDEN % config["BLOCK_K"] == 0, PDL=True, BLOCK_N=config["BLOCK_N"],
                              BLOCK_K=config["BLOCK_K"])
            ptx = compiled_ptx(_fused_linear_kernel, FUSED_LINEAR, constexprs, config["num_warps"])
            print(describe(f"fused_linear {family} add_norm {name}", ptx))


if __name__ == "__main__":
    main()
