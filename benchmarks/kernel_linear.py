"""Batch-1 linear layers on a CUDA GPU: `python benchmarks/kernel_linear.py OUT.json [--fp8]`.

For the projections of Qwen3-0.6B and Llama-3.1-8B (bf16 weights, or e4m3 with per-channel scales under --fp8, as
`--quantization fp8` stores them; the LM head stays bf16), with what the decoder fuses around each:
- a launch-config sweep of fused_linear, against cuBLAS (F.linear alone) on the same weights;
- the unfused path (norm kernel, cuBLAS, SiLU kernel) against fused_linear with its default config.
Each timed call cycles through enough copies of the weight to outgrow the L2 cache, as a model's layers do, and is
replayed from a CUDA graph as a decode step is. Bandwidth counts the weight bytes alone.
"""
import argparse
import dataclasses
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

from sluice.kernels import fused_add_rms_norm, fused_linear, fused_linear_ref, silu_and_mul
from sluice.kernels.fp8_quant import quantize_rows_fp8
from sluice.worker.ops.fp8 import quantize_rows
from sluice.worker.ops.fp8_gemm import scaled_mm_fp8_linear

DTYPE = torch.bfloat16
STREAMED_BYTES = 512 << 20  # weight bytes per timed call, several times the 60 MB L2
# (model, projection, output features, input features, fused around it)
PROJECTIONS = [
    ("Qwen3-0.6B", "qkv", 4096, 1024, "add_norm"),
    ("Qwen3-0.6B", "o", 1024, 2048, "plain"),
    ("Qwen3-0.6B", "gate_up", 3072, 1024, "add_norm_gated"),
    ("Qwen3-0.6B", "down", 1024, 3072, "plain"),
    ("Qwen3-0.6B", "lm_head", 151936, 1024, "add_norm_logits"),
    ("Llama-3.1-8B", "qkv", 6144, 4096, "add_norm"),
    ("Llama-3.1-8B", "o", 4096, 4096, "plain"),
    ("Llama-3.1-8B", "gate_up", 14336, 4096, "add_norm_gated"),
    ("Llama-3.1-8B", "down", 4096, 14336, "plain"),
    ("Llama-3.1-8B", "lm_head", 128256, 4096, "add_norm_logits"),
]
SWEEP = [dict(BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=1)
         for n in (1, 2, 4, 8) for k in (1024, 2048, 4096) for w in (4, 8)]
FP8_SWEEP = [dict(BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=1)
             for n in (1, 2, 4, 8) for k in (1024, 2048, 4096) for w in (2, 4, 8)]


def time_us(fn, calls: int) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=10, return_mode="median") * 1e3 / calls


def weight_copies(rows: int, k: int, fp8: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, weight_scale) pairs: enough copies to stream STREAMED_BYTES."""
    count = max(1, -(-STREAMED_BYTES // (rows * k * (1 if fp8 else 2))))
    copies = []
    for _ in range(count):
        weight = torch.randn(rows, k, device="cuda", dtype=DTYPE) / k**0.5
        copies.append(quantize_rows(weight) if fp8 else (weight, None))
    return copies


def fused_options(variant: str, k: int) -> dict:
    if variant == "plain":
        return {}
    return dict(norm_weight=torch.ones(k, device="cuda", dtype=DTYPE), eps=1e-6,
                residual=torch.randn(1, k, device="cuda", dtype=DTYPE), gated=variant.endswith("gated"),
                out_dtype=torch.float32 if variant.endswith("logits") else None)


def unfused(x, weight, weight_scale, options):
    """What the decoder runs at more than one row: Triton norm, cuBLAS (or the FP8 GEMM), Triton SiLU gate."""
    if "norm_weight" in options:
        x, _ = fused_add_rms_norm(x, options["residual"], options["norm_weight"], options["eps"])
    y = F.linear(x, weight) if weight_scale is None else scaled_mm_fp8_linear(x, weight, weight_scale, None)
    if options.get("gated"):
        y = silu_and_mul(y)
    return y if options.get("out_dtype") is None else y.to(options["out_dtype"])


def bench_projection(model: str, name: str, n: int, k: int, variant: str, fp8: bool, configs: list[dict]) -> dict:
    options = fused_options(variant, k)
    fp8 = fp8 and variant != "add_norm_logits"
    weights = weight_copies(2 * n if options.get("gated") else n, k, fp8)
    x = torch.randn(1, k, device="cuda", dtype=DTYPE)
    weight, scale = weights[0]
    ok = torch.allclose(fused_linear(x, weight, weight_scale=scale, **options)[0].float(),
                        fused_linear_ref(x, weight, weight_scale=scale, **options)[0].float(), atol=5e-2, rtol=5e-2)
    row = dict(model=model, projection=name, n=n, k=k, variant=variant, fp8=fp8, ok=ok,
               cublas_us=None if fp8 else time_us(lambda: [F.linear(x, w) for w, _ in weights], len(weights)),
               unfused_us=time_us(lambda: [unfused(x, w, s, options) for w, s in weights], len(weights)),
               fused_us=time_us(lambda: [fused_linear(x, w, weight_scale=s, **options) for w, s in weights],
                                len(weights)),
               weight_bytes=weight.numel() * weight.element_size(), sweep=[])
    for config in configs:
        if k % config["BLOCK_K"] == 0:
            us = time_us(lambda: [fused_linear(x, w, weight_scale=s, **options, launch_config=config)
                                  for w, s in weights], len(weights))
            row["sweep"].append(dict(us=us, **config))
    return row


def bench_activation_quant(model: str) -> list[dict]:
    """The FP8 GEMM of many rows (a decode batch, a prefill step) with its activations quantized by torch's
    operators against kernels.fp8_quant, and the quantization alone."""
    rows = []
    for _, name, n, k, variant in [p for p in PROJECTIONS if p[0] == model and not p[4].endswith("logits")]:
        weight, scale = quantize_rows(torch.randn(2 * n if variant.endswith("gated") else n, k, device="cuda",
                                                  dtype=DTYPE) / k**0.5)
        for m in (256, 8192):
            x = torch.randn(m, k, device="cuda", dtype=DTYPE)
            row = dict(projection=name, rows=m, k=k)
            for label, quantize in (("torch", quantize_rows), ("kernel", quantize_rows_fp8)):
                gemm = dataclasses.replace(scaled_mm_fp8_linear, quantize=quantize)
                row[f"quant_{label}_us"] = time_us(lambda: quantize(x), 1)
                row[f"gemm_{label}_us"] = time_us(lambda: gemm(x, weight, scale, None), 1)
            rows.append(row)
            print(f"{name:<8} {m:>5} x {k:<6} quantize {row['quant_torch_us']:>8.1f} -> "
                  f"{row['quant_kernel_us']:>7.1f} us   FP8 GEMM {row['gemm_torch_us']:>8.1f} -> "
                  f"{row['gemm_kernel_us']:>8.1f} us", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out")
    parser.add_argument("--no-sweep", action="store_true", help="only the default configs")
    parser.add_argument("--fp8", action="store_true", help="e4m3 weights with per-channel scales")
    parser.add_argument("--models", nargs="+", default=["Qwen3-0.6B", "Llama-3.1-8B"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernel_linear.py needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = []
    print(f"{'model':<13} {'proj':<8} {'cuBLAS':>7} {'unfused':>8} {'fused':>7} {'GB/s':>5} {'ok':>3}  "
          f"best of sweep (us BLOCK_N/BLOCK_K/warps/stages)")
    sweep = [] if args.no_sweep else FP8_SWEEP if args.fp8 else SWEEP
    for projection in [p for p in PROJECTIONS if p[0] in args.models]:
        row = bench_projection(*projection, fp8=args.fp8, configs=sweep)
        rows.append(row)
        best = sorted(row["sweep"], key=lambda r: r["us"])[:3]
        print(f"{row['model']:<13} {row['projection']:<8} {row['cublas_us'] or 0:>7.2f} {row['unfused_us']:>8.2f} "
              f"{row['fused_us']:>7.2f} {row['weight_bytes'] / row['fused_us'] / 1e3:>5.0f} {row['ok']!s:>3}  "
              + "  ".join(f"{r['us']:.2f} {r['BLOCK_N']}/{r['BLOCK_K']}/{r['num_warps']}/{r['num_stages']}"
                          for r in best), flush=True)
    quant = [row for model in args.models for row in bench_activation_quant(model)] if args.fp8 else []
    with open(args.json_out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), projections=rows, activation_quant=quant), f, indent=2)
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
