"""Batch-1 linear layers on a CUDA GPU: `python benchmarks/kernel_linear.py OUT.json`.

For the projections of Qwen3-0.6B and Llama-3.1-8B (bf16), with what the decoder fuses around each:
- a launch-config sweep of fused_linear, against cuBLAS (F.linear alone) on the same weights;
- the unfused path (norm kernel, cuBLAS, SiLU kernel) against fused_linear with its default config.
Each timed call cycles through enough copies of the weight to outgrow the L2 cache, as a model's layers do, and is
replayed from a CUDA graph as a decode step is. Bandwidth counts the weight bytes alone.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.testing

from kernels import fused_add_rms_norm, fused_linear, fused_linear_ref, silu_and_mul

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


def time_us(fn, calls: int) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=10, return_mode="median") * 1e3 / calls


def weight_copies(rows: int, k: int) -> list[torch.Tensor]:
    count = max(1, -(-STREAMED_BYTES // (rows * k * 2)))
    return [torch.randn(rows, k, device="cuda", dtype=DTYPE) / k**0.5 for _ in range(count)]


def fused_options(variant: str, k: int) -> dict:
    if variant == "plain":
        return {}
    return dict(norm_weight=torch.ones(k, device="cuda", dtype=DTYPE), eps=1e-6,
                residual=torch.randn(1, k, device="cuda", dtype=DTYPE), gated=variant.endswith("gated"),
                out_dtype=torch.float32 if variant.endswith("logits") else None)


def unfused(x, weight, options):
    """What the decoder runs at more than one row: Triton norm, cuBLAS, Triton SiLU gate."""
    if "norm_weight" in options:
        x, _ = fused_add_rms_norm(x, options["residual"], options["norm_weight"], options["eps"])
    y = F.linear(x, weight)
    if options.get("gated"):
        y = silu_and_mul(y)
    return y if options.get("out_dtype") is None else y.to(options["out_dtype"])


def bench_projection(model: str, name: str, n: int, k: int, variant: str, configs: list[dict]) -> dict:
    options = fused_options(variant, k)
    weights = weight_copies(2 * n if options.get("gated") else n, k)
    x = torch.randn(1, k, device="cuda", dtype=DTYPE)
    ok = torch.allclose(fused_linear(x, weights[0], **options)[0].float(),
                        fused_linear_ref(x, weights[0], **options)[0].float(), atol=5e-2, rtol=5e-2)
    row = dict(model=model, projection=name, n=n, k=k, variant=variant, ok=ok,
               cublas_us=time_us(lambda: [F.linear(x, w) for w in weights], len(weights)),
               unfused_us=time_us(lambda: [unfused(x, w, options) for w in weights], len(weights)),
               fused_us=time_us(lambda: [fused_linear(x, w, **options) for w in weights], len(weights)),
               weight_bytes=weights[0].numel() * 2, sweep=[])
    for config in configs:
        if k % config["BLOCK_K"] == 0:
            us = time_us(lambda: [fused_linear(x, w, **options, launch_config=config) for w in weights], len(weights))
            row["sweep"].append(dict(us=us, **config))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out")
    parser.add_argument("--no-sweep", action="store_true", help="only the default configs")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernel_linear.py needs a CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    rows = []
    print(f"{'model':<13} {'proj':<8} {'cuBLAS':>7} {'unfused':>8} {'fused':>7} {'GB/s':>5} {'ok':>3}  "
          f"best of sweep (us BLOCK_N/BLOCK_K/warps/stages)")
    for projection in PROJECTIONS:
        row = bench_projection(*projection, configs=[] if args.no_sweep else SWEEP)
        rows.append(row)
        best = sorted(row["sweep"], key=lambda r: r["us"])[:3]
        print(f"{row['model']:<13} {row['projection']:<8} {row['cublas_us']:>7.2f} {row['unfused_us']:>8.2f} "
              f"{row['fused_us']:>7.2f} {row['weight_bytes'] / row['fused_us'] / 1e3:>5.0f} {row['ok']!s:>3}  "
              + "  ".join(f"{r['us']:.2f} {r['BLOCK_N']}/{r['BLOCK_K']}/{r['num_warps']}/{r['num_stages']}"
                          for r in best), flush=True)
    with open(args.json_out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), projections=rows), f, indent=2)
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
