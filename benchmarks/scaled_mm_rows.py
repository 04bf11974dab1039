"""FP8 GEMMs by row count on a CUDA GPU: `python benchmarks/scaled_mm_rows.py OUT.json [--model Llama-3.1-8B]
[--max-rows 1024]`.

torch._scaled_mm as the FP8 linear layers call it (row-wise scales, fast accumulation, bf16 out) at a model shape's
four projections, for every row count in steps of 16: as it is, padded to the next multiple of 64, 128 and 256,
and at the rows `sluice.worker.ops.fp8_gemm.scaled_mm_rows` runs it at. Prints one line per row count (us) and the row
counts where some padding beats the rule by more than 5% on the four together.
"""
import argparse
import json

import torch
import triton.testing

from sluice.worker.loading.shapes import shape_config
from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.fp8 import FP8
from sluice.worker.ops.fp8_gemm import scaled_mm_rows


def projections(model: str) -> dict[str, tuple[int, int]]:
    """Each decoder projection's (output features, input features), as the multi-row FP8 GEMMs see them."""
    config = ModelConfig.from_hf(shape_config(model))
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {"qkv": (q + 2 * kv, config.hidden_size), "o": (config.hidden_size, q),
            "gate_up": (2 * config.intermediate_size, config.hidden_size),
            "down": (config.hidden_size, config.intermediate_size)}


def gemm_us(weight: torch.Tensor, weight_scale: torch.Tensor, x_q: torch.Tensor, x_scale: torch.Tensor,
            rows: int) -> float:
    return triton.testing.do_bench(
        lambda: torch._scaled_mm(x_q[:rows], weight.T, scale_a=x_scale[:rows], scale_b=weight_scale,
                                 out_dtype=torch.bfloat16, use_fast_accum=True), return_mode="median") * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="scaled_mm_rows.json")
    parser.add_argument("--model", default="Llama-3.1-8B", help="a model shape (sluice.worker.loading.shapes)")
    parser.add_argument("--max-rows", type=int, default=1024)
    args = parser.parse_args()
    shapes = projections(args.model)
    most_rows = -(-args.max_rows // 256) * 256
    weights = {name: (torch.randn(n, k, device="cuda").to(FP8), torch.rand(1, n, device="cuda") + 0.5)
               for name, (n, k) in shapes.items()}
    activations = {k: (torch.randn(most_rows, k, device="cuda").to(FP8), torch.rand(most_rows, 1, device="cuda") + 0.5)
                   for k in {k for _, k in shapes.values()}}
    results = {}
    for rows in range(16, args.max_rows + 1, 16):
        padded = sorted({rows, scaled_mm_rows(rows)} | {-(-rows // step) * step for step in (64, 128, 256)})
        times = {name: {p: gemm_us(*weights[name], *activations[shapes[name][1]], p) for p in padded}
                 for name in shapes}
        totals = {p: sum(t[p] for t in times.values()) for p in padded}
        results[rows] = {"us": times, "total_us": totals, "rule": scaled_mm_rows(rows)}
        best = min(totals, key=totals.get)
        flag = f"  padding to {best} beats the rule" if totals[best] < 0.95 * totals[scaled_mm_rows(rows)] else ""
        print(f"{rows:5d} " + "  ".join(f"{name} " + "/".join(f"{p}:{t[p]:.1f}" for p in padded)
                                        for name, t in times.items()) + flag, flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
