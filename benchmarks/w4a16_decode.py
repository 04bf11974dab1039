"""The W4A16 decode kernel on a CUDA GPU at Llama-3.1-8B's projections (groups of 128, symmetric), by row count:
`python benchmarks/w4a16_decode.py OUT.json [--sweep] [--rows 1 8]`.

Each row gives the packed weights' bytes plus scales over the kernel's time, replayed from a CUDA graph, in GB/s and
as a fraction of a device-to-device copy measured in the same run (bytes read plus bytes written, as
benchmarks/kernel_timings.py counts), at the launch config kernels.w4a16 picks; --sweep times a grid of decode tiles
per shape and prints the best, for w4a16_launch_config's rule. Everything also goes to OUT.json.
"""
import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.testing

from sluice.kernels.w4a16 import w4a16_launch_config, w4a16_linear
from sluice.kernels.w4a16_layout import quantize

sys.path.append(str(Path(__file__).parents[1]))  # benchmarks/, behind the installed packages
from benchmarks.kernel_timings import copy_bandwidth_gbs

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
GROUP = 128
SWEEP = dict(BLOCK_N=(16, 32, 64), BLOCK_K=(256, 512, 1024), STAGES=(3,), num_warps=(4, 8))


def graph_us(fn) -> float:
    return 1000 * triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args()
    copy_gbs = copy_bandwidth_gbs("cuda")
    print(f"copy: {copy_gbs:,.0f} GB/s")
    results = {"copy_gbs": copy_gbs, "device": torch.cuda.get_device_name(), "rows": []}
    for name, (n, k) in SHAPES.items():
        weight = quantize(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02, GROUP, sym=True)
        nbytes = weight.qweight.numel() * 4 + weight.scales.numel() * 2
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            default = w4a16_launch_config(m, n, k, GROUP, x.dtype, x.device)
            row = {"shape": name, "n": n, "k": k, "m": m, "config": default,
                   "us": graph_us(lambda: w4a16_linear(x, weight))}
            if args.sweep:
                row["sweep"] = sweep(x, weight)
            row["copy_fraction"] = nbytes / row["us"] / 1e3 / copy_gbs
            best = min(row.get("sweep", [row]), key=lambda r: r["us"])
            print(f"{name} {n}x{k} m={m}: {row['us']:.1f} us, {row['copy_fraction']:.0%} of copy at {default}; "
                  f"best {best['us']:.1f} us ({nbytes / best['us'] / 1e3 / copy_gbs:.0%}) at {best['config']}")
            results["rows"].append(row)
            with open(args.out, "w") as out:  # after each row, so a sweep cut short keeps what it measured
                json.dump(results, out, indent=1)


def sweep(x: torch.Tensor, weight) -> list[dict]:
    rows = []
    m = x.shape[0]
    for values in itertools.product(*SWEEP.values()):
        config = dict(zip(SWEEP, values), decode=True, BLOCK_M=triton.next_power_of_2(m))
        try:
            rows.append({"config": config, "us": graph_us(lambda: w4a16_linear(x, weight, launch_config=config))})
        except Exception as error:  # a tile that does not compile (shared memory, registers) is skipped
            print(f"  {config}: {type(error).__name__}")
    return rows


if __name__ == "__main__":
    main()
