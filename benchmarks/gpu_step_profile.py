"""Where a throughput run's time goes, in process (run on a CUDA machine).

Runs the standard throughput workload (Qwen3-0.6B shapes, dummy bf16 weights) and times every worker step by kind
(pure decode, or carrying prefill tokens) and the host time around it; then profiles a window of mixed steps and a
window of decode steps with torch.profiler and prints the top operators. JSON goes to the first argument.
"""
import json
import statistics
import sys
import time
from collections import defaultdict

from torch.profiler import ProfilerActivity, profile

from sluice.bench.workload import random_workload
from sluice.offline import OfflineEngine
from sluice.sampling_params import SamplingParams
from worker_svc.config import WorkerConfig
from worker_svc.engine import WorkerEngine

SHAPE = "Qwen3-0.6B"


class TimedWorker:
    """Wraps WorkerEngine.execute: records each step's kind, size and time; profiles chosen step windows."""

    def __init__(self, worker: WorkerEngine, windows: dict[str, range]):
        self.worker = worker
        self.steps: list[dict] = []
        self.windows = windows
        self.tables: dict[str, str] = {}
        self._profiler = None

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def execute(self, plan):
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
        outcome = self.worker.execute(plan)
        tokens = sum(plan.num_scheduled_tokens.values())
        self.steps.append({"seqs": len(plan.num_scheduled_tokens), "tokens": tokens,
                           "decode": tokens == len(plan.num_scheduled_tokens), "start": started,
                           "ms": (time.perf_counter() - started) * 1000})
        return outcome


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_step_profile.json"
    worker = WorkerEngine.load(WorkerConfig(model=SHAPE, load_format="dummy", dtype="bfloat16", device="cuda"))
    engine = OfflineEngine(worker, max_model_len=4096)
    requests = random_workload(256, (100, 1024), (100, 1024), worker.model_config.vocab_size)
    params = [SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in requests]
    prompts = [r.prompt_token_ids for r in requests]
    engine.generate(prompts[:4], params[:4])  # warm-up
    results = {}
    for steps_in_flight in (2, 1):
        timed = TimedWorker(worker, {"mixed": range(4, 8), "decode": range(400, 420)} if steps_in_flight == 1 else {})
        engine.worker, engine.steps_in_flight = timed, steps_in_flight
        started = time.perf_counter()
        outputs = engine.generate(prompts, params)
        wall = time.perf_counter() - started
        by_kind = defaultdict(list)
        for step in timed.steps:
            by_kind["decode" if step["decode"] else "mixed"].append(step)
        summary = {"wall_s": wall, "output_tok_per_s": sum(len(o.token_ids) for o in outputs) / wall,
                   "steps": len(timed.steps),
                   "outside_execute_s": wall - sum(s["ms"] for s in timed.steps) / 1000}
        for kind, steps in by_kind.items():
            summary[kind] = {"steps": len(steps), "total_s": sum(s["ms"] for s in steps) / 1000,
                             "median_ms": statistics.median(s["ms"] for s in steps),
                             "median_seqs": statistics.median(s["seqs"] for s in steps),
                             "median_tokens": statistics.median(s["tokens"] for s in steps)}
        decode_256 = [s["ms"] for s in timed.steps if s["decode"] and s["seqs"] >= 240]
        if decode_256:
            summary["decode_240_plus_median_ms"] = statistics.median(decode_256)
        results[f"steps_in_flight_{steps_in_flight}"] = summary
        print(f"steps in flight {steps_in_flight}: {json.dumps(summary, indent=1)}", flush=True)
        for name, table in timed.tables.items():
            print(f"== profile: {name} steps\n{table}", flush=True)
            results[f"profile_{name}"] = table
    with open(out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
