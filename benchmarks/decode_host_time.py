"""Where a steady decode step's host time goes in the worker, in process (run on a CUDA machine).

Runs `--batch` requests of a short prompt and `--output-len` greedy tokens each through the real Scheduler and
WorkerEngine (dummy bf16 weights of `--model`, e4m3 under `--quantization fp8`), times the host side of every
pure-decode step's launch and finish, and profiles the worker's calls with cProfile over the last `--profiled-steps`
of them; `--kernels` lists the kernels of 20 more steps and writes their trace. JSON goes to the first argument;
the top functions by own time are printed.
"""
import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine


class HostTimedWorker:
    """Wraps WorkerEngine.launch and finish: host milliseconds of each decode step; cProfile once `profiling`."""

    def __init__(self, worker: WorkerEngine):
        self.worker = worker
        self.launch_ms: list[float] = []
        self.finish_ms: list[float] = []
        self.profiler = cProfile.Profile()
        self.profiling = False

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def launch(self, plan):
        return self._timed(self.launch_ms, self.worker.launch, plan,
                           sum(plan.num_scheduled_tokens.values()) == len(plan.num_scheduled_tokens))

    def finish(self, step):
        return self._timed(self.finish_ms, self.worker.finish, step, True)

    def _timed(self, into: list[float], call, argument, record: bool):
        started = time.perf_counter()
        if self.profiling:
            self.profiler.enable()
        result = call(argument)
        if self.profiling:
            self.profiler.disable()
        if record:
            into.append((time.perf_counter() - started) * 1000)
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="decode_host_time.json")
    parser.add_argument("--model", default="Qwen3-0.6B")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--output-len", type=int, default=1024)
    parser.add_argument("--profiled-steps", type=int, default=300)
    parser.add_argument("--kernels", action="store_true", help="list the kernels of 20 steps (torch.profiler)")
    parser.add_argument("--quantization", default="auto", choices=["auto", "fp8"])
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8"])
    args = parser.parse_args()
    worker = WorkerEngine.load(WorkerConfig(
        model=args.model, load_format="dummy", dtype="bfloat16", device="cuda", quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype))
    engine = OfflineEngine(worker, max_model_len=4096)
    vocab_size = worker.model_config.vocab_size
    prompts = [[(7 * i + j) % vocab_size for j in range(32)] for i in range(args.batch)]
    params = [SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)] * args.batch
    engine.generate(prompts, [SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)] * args.batch)
    timed = HostTimedWorker(worker)
    engine.worker = timed
    started = time.perf_counter()
    engine.generate(prompts, params)
    wall = time.perf_counter() - started
    summary = {"model": args.model, "batch": args.batch, "ms_per_step": wall * 1000 / args.output_len,
               "median_launch_ms": statistics.median(timed.launch_ms),
               "median_finish_ms": statistics.median(timed.finish_ms)}
    summary["graph_replay_ms"] = _graph_replay_ms(worker, args.batch)
    if args.kernels:
        engine.worker = worker
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            engine.generate(prompts, [SamplingParams(max_tokens=21, temperature=0.0, ignore_eos=True)] * args.batch)
        print(profiler.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
        profiler.export_chrome_trace(args.out.removesuffix(".json") + "_trace.json")
        engine.worker = timed
    timed.profiling = True
    engine.generate(prompts, [SamplingParams(max_tokens=args.profiled_steps, temperature=0.0, ignore_eos=True)]
                    * args.batch)
    text = io.StringIO()
    pstats.Stats(timed.profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(json.dumps(summary), flush=True)
    summary["profile"] = text.getvalue()
    print(summary["profile"], flush=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)


def _graph_replay_ms(worker: WorkerEngine, batch: int, replays: int = 500) -> float:
    """The device time of the decode graph alone, replayed back to back: the floor of a decode step."""
    graphs = worker.runner.decode_graphs
    graph = graphs.graphs[next(size for size in graphs.sizes if size >= batch)]
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1000 / replays


if __name__ == "__main__":
    main()
