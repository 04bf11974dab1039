"""Where a throughput run's time goes, in process (run on a CUDA machine).

Runs the standard throughput workload (Qwen3-0.6B shapes, dummy bf16 weights; `--model`, `--num-requests`,
`--input-len` and `--output-len` change it) and records every step's kind (pure decode, or carrying prefill tokens),
size, and the host time of its launch and of its finish (which waits for the device); then runs a second workload
(other prompts, so no prefix-cache hits) under torch.profiler windows over mixed and decode steps and prints the top
operators. JSON goes to the first argument; the sampling controls of `sluice bench` (`--temperature`, `--top-p`,
`--logprobs`, ...) set the requests' (greedy by default), and `--quantization fp8` and `--kv-cache-dtype fp8` run
the worker on FP8 weights and an FP8 cache.
"""
import argparse
import json
import statistics
import time

from torch.profiler import ProfilerActivity, profile

from sluice.cli.bench.sampling_flags import add_sampling_options, with_sampling
from sluice.cli.bench.workload import random_workload
from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine


class TimedWorker:
    """Wraps WorkerEngine.launch and finish: records each step's kind, size and host times; profiles step windows."""

    def __init__(self, worker: WorkerEngine, windows: dict[str, range]):
        self.worker = worker
        self.steps: list[dict] = []
        self.windows = windows
        self.tables: dict[str, str] = {}
        self._profiler = None
        self._finish_row: dict[int, dict] = {}

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def launch(self, plan):
        index = len(self.steps)
        for name, window in self.windows.items():
            if index == window.start:
                self._profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                self._profiler.start()
            if index == window.stop and self._profiler is not None:
                self._profiler.stop()
                averages = self._profiler.key_averages()
                self.tables[name] = (averages.table(sort_by="self_cuda_time_total", row_limit=15) + "\n"
                                     + averages.table(sort_by="self_cpu_time_total", row_limit=15))
                self._profiler = None
        started = time.perf_counter()
        step = self.worker.launch(plan)
        tokens = sum(plan.num_scheduled_tokens.values())
        self.steps.append({"seqs": len(plan.num_scheduled_tokens), "tokens": tokens,
                           "decode": tokens == len(plan.num_scheduled_tokens), "start": started,
                           "launch_ms": (time.perf_counter() - started) * 1000, "finish_ms": 0.0})
        self._finish_row[id(step)] = self.steps[-1]
        return step

    def finish(self, step):
        started = time.perf_counter()
        outcome = self.worker.finish(step)
        self._finish_row.pop(id(step))["finish_ms"] = (time.perf_counter() - started) * 1000
        return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", default="gpu_step_profile.json")
    parser.add_argument("--seed", type=int, default=0, help="of the sampled draws")
    parser.add_argument("--model", default="Qwen3-0.6B", help="a model shape of the dummy weights")
    parser.add_argument("--quantization", choices=["auto", "fp8"], default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype) or fp8")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--input-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(100, 1024), metavar=("MIN", "MAX"))
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--no-dependent-launch", dest="dependent_launch", action="store_false",
                        help="launch each kernel after the one before ends, so that the profile charges each its own "
                             "time (with programmatic dependent launch a kernel's time includes its wait)")
    add_sampling_options(parser)
    args = parser.parse_args()
    worker = WorkerEngine.load(WorkerConfig(model=args.model, load_format="dummy", dtype="bfloat16", device="cuda",
                                            quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
                                            dependent_launch=args.dependent_launch))
    engine = OfflineEngine(worker, max_model_len=4096, max_num_seqs=args.max_num_seqs)
    vocab_size = worker.model_config.vocab_size
    engine.generate(*_workload(4, vocab_size, 2, args))  # warm-up
    results = {}
    for name, seed, windows in (("timed", 0, {}), ("profiled", 1, {"mixed": range(2, 5), "decode": range(400, 410)})):
        timed = TimedWorker(worker, windows)
        engine.worker = timed
        started = time.perf_counter()
        outputs = engine.generate(*_workload(args.num_requests, vocab_size, seed, args))
        wall = time.perf_counter() - started
        summary = {"wall_s": wall, "output_tok_per_s": sum(len(o.token_ids) for o in outputs) / wall,
                   "steps": len(timed.steps)}
        for kind, steps in (("decode", [s for s in timed.steps if s["decode"]]),
                            ("mixed", [s for s in timed.steps if not s["decode"]])):
            period = [b["start"] - a["start"] for a, b in zip(steps, steps[1:])]
            summary[kind] = {"steps": len(steps), "median_seqs": statistics.median(s["seqs"] for s in steps),
                             "median_tokens": statistics.median(s["tokens"] for s in steps),
                             "median_launch_ms": statistics.median(s["launch_ms"] for s in steps),
                             "median_finish_ms": statistics.median(s["finish_ms"] for s in steps),
                             "median_step_period_ms": statistics.median(period) * 1000 if period else None}
        results[name] = summary
        print(f"{name}: {json.dumps(summary, indent=1)}", flush=True)
        for window, table in timed.tables.items():
            print(f"== profile: {window} steps\n{table}", flush=True)
            results[f"profile_{window}"] = table
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


def _workload(num_requests: int, vocab_size: int, seed: int,
              args: argparse.Namespace) -> tuple[list[list[int]], list[SamplingParams]]:
    requests = with_sampling(random_workload(num_requests, tuple(args.input_len), tuple(args.output_len), vocab_size,
                                             seed), args)
    return [r.prompt_token_ids for r in requests], [r.sampling_params() for r in requests]


if __name__ == "__main__":
    main()
