"""Prefill/decode disaggregation, measured. `transfer`: the workers' NIXL pull between two processes, by block count
(the KV cache of a named shape; --device cuda:0 for GPU memory, both processes on one GPU, or --pull-device cuda:1 for
the reader on another). `serve`: Poisson arrivals of long prompts mixed with short ones against `sluice serve` and
`sluice serve --pd` in turn, on the same flags, their TTFT and ITL percentiles side by side (`sluice bench serve`).
Run from the repository root:
  .venv/bin/python benchmarks/pd_serving.py transfer [--shape SmolLM2-135M] [--blocks 1 4 16 64 256]
  .venv/bin/python benchmarks/pd_serving.py serve [--rate 0.5] [--num-requests 24] [-- SERVE_FLAGS...]"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from sluice.cli.launcher import free_port, stop_services, wait_until_serving
from sluice.cli.python_command import sluice_command


def _kv_caches(shape: str, num_blocks: int, block_size: int, dtype: str, device: str):
    from sluice.worker.loading.shapes import shape_config
    from sluice.worker.models.config import ModelConfig
    from sluice.worker.runner.kv_cache import allocate_kv_cache

    config = ModelConfig.from_hf(shape_config(shape))
    return allocate_kv_cache(config, num_blocks, block_size, getattr(torch, dtype), torch.device(device))


def _hold(args, sources, done) -> None:
    """The prefill side: a registered cache, described to the reader, held until it is done."""
    from sluice.worker.kv_transfer.agent import KvTransferAgent

    agent = KvTransferAgent("bench-prefill", _kv_caches(args.shape, args.num_blocks, args.block_size, args.dtype,
                                                        args.device), serves_reads=True)
    sources.put(agent.source)
    done.get()


def _pull(args, sources, done, results) -> None:
    import asyncio

    from sluice.worker.kv_transfer.agent import KvTransferAgent

    agent = KvTransferAgent("bench-decode", _kv_caches(args.shape, args.num_blocks, args.block_size, args.dtype,
                                                       args.pull_device or args.device), serves_reads=False)
    source = sources.get()
    rows = []
    for count in args.blocks:
        blocks = list(range(count))
        asyncio.run(agent.pull(source, blocks, blocks, 60.0))  # the first pull of a count connects and warms up
        started = time.perf_counter()
        num_bytes = sum(asyncio.run(agent.pull(source, blocks, blocks, 60.0)) for _ in range(args.repeats))
        seconds = (time.perf_counter() - started) / args.repeats
        rows.append({"blocks": count, "bytes": num_bytes // args.repeats, "ms": seconds * 1000,
                     "gb_per_s": num_bytes / args.repeats / seconds / 1e9})
    results.put(rows)
    done.put(None)


def transfer(args) -> list[dict]:
    context = mp.get_context("spawn")
    sources, done, results = context.Queue(), context.Queue(), context.Queue()
    holder = context.Process(target=_hold, args=(args, sources, done))
    reader = context.Process(target=_pull, args=(args, sources, done, results))
    holder.start()
    reader.start()
    rows = results.get()
    reader.join()
    holder.join()
    print(f"== NIXL pull, {args.shape} KV cache in {args.dtype}, blocks of {args.block_size} tokens, "
          f"{args.device} -> {args.pull_device or args.device}")
    for row in rows:
        print(f"{row['blocks']:5d} blocks  {row['bytes'] / 1e6:9.2f} MB  {row['ms']:8.3f} ms  "
              f"{row['gb_per_s']:7.2f} GB/s")
    return rows


def _serving_run(args, serve_flags: list[str], out: Path) -> dict:
    port = free_port()
    serve = subprocess.Popen([*sluice_command("serve"), "--port", str(port), *serve_flags])
    try:
        wait_until_serving(f"127.0.0.1:{port}", "sluice.v1.Generation", 600, [serve])
        subprocess.run([*sluice_command("bench", "serve"), "--address", f"127.0.0.1:{port}", "--rate", str(args.rate),
                        "--num-requests", str(args.num_requests), "--input-len", *map(str, args.input_len),
                        "--output-len", *map(str, args.output_len), "--vocab-size", str(args.vocab_size),
                        "--seed", str(args.seed), "--out", str(out)], check=True)
    finally:
        stop_services([serve], timeout=60)
    return json.loads(out.read_text())["summary"]


def serve(args) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        runs = {name: _serving_run(args, flags, Path(folder) / f"{name}.json")
                for name, flags in (("combined", args.serve_flags), ("--pd", ["--pd", *args.serve_flags]))}
    print(f"== {args.num_requests} requests at {args.rate} req/s, input {args.input_len}, output {args.output_len}")
    print(f"{'':10}" + "".join(f"{name} {point:>4}" .rjust(12) for name in ("TTFT", "ITL") for point in
                                ("p50", "p90", "p99")))
    for name, summary in runs.items():
        print(f"{name:10}" + "".join(f"{summary[key][point]:12.1f}" for key in ("ttft_ms", "itl_ms")
                                     for point in ("p50", "p90", "p99")))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="write the figures as JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    pull = commands.add_parser("transfer", help="NIXL pull throughput by block count")
    pull.add_argument("--shape", default="SmolLM2-135M", help="a random-weight shape's KV cache (docs/models.md)")
    pull.add_argument("--dtype", default="float32")
    pull.add_argument("--device", default="cpu", help="the prefill side's cache")
    pull.add_argument("--pull-device", help="the decode side's cache (default: --device)")
    pull.add_argument("--block-size", type=int, default=16)
    pull.add_argument("--num-blocks", type=int, default=512)
    pull.add_argument("--blocks", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    pull.add_argument("--repeats", type=int, default=10)
    pull.set_defaults(run=transfer)
    serving = commands.add_parser("serve", help="TTFT and ITL, disaggregated against combined")
    serving.add_argument("--rate", type=float, default=0.5, help="Poisson arrivals per second")
    serving.add_argument("--num-requests", type=int, default=24)
    serving.add_argument("--input-len", type=int, nargs=2, default=[32, 1024], help="uniform in [MIN, MAX]: long "
                                                                                    "prompts mixed with short ones")
    serving.add_argument("--output-len", type=int, nargs=2, default=[32, 64])
    serving.add_argument("--vocab-size", type=int, default=49152)
    serving.add_argument("--seed", type=int, default=0)
    serving.add_argument("serve_flags", nargs=argparse.REMAINDER, help="after --: flags of sluice serve for both")
    serving.set_defaults(run=serve)
    args = parser.parse_args()
    if getattr(args, "serve_flags", None) and args.serve_flags[0] == "--":
        args.serve_flags = args.serve_flags[1:]
    result = args.run(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
