"""Time of one worker decode step on random Qwen3-0.6B weights at batch 1 and 256, with and without CUDA graphs
(run on a CUDA machine). Prints each figure and writes JSON to the path given as the first argument; with CUDA graphs
at batch 1 it also profiles the steps and prints the device time per step of each kernel.
"""
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.scheduler.request import Request
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine


def decode_step_ms(shape: str, batch: int, enforce_eager: bool, context: int = 512, steps: int = 50,
                   profile_steps: range = range(0)) -> tuple[float, str]:
    """(median ms of a synchronous decode step, a kernel table of the steps in profile_steps or "")."""
    worker = WorkerEngine.load(WorkerConfig(model=shape, load_format="dummy", dtype="bfloat16", device="cuda",
                                            enforce_eager=enforce_eager, gpu_memory_utilization=0.8))
    engine = OfflineEngine(worker, max_model_len=4096, max_num_seqs=256)
    prompts = [[(i * 7 + j) % 1000 for j in range(context)] for i in range(batch)]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.generate(prompts, [params] * batch)  # warm-up
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    scheduler = engine.scheduler
    for i, prompt in enumerate(prompts):
        scheduler.add_request(Request(f"timed-{i}", prompt, params))
    times, profiler, table = [], None, ""
    while scheduler.has_unfinished_requests():
        if len(times) == profile_steps.start and profile_steps:
            profiler = profile(activities=[ProfilerActivity.CUDA])
            profiler.start()
        if len(times) == profile_steps.stop and profiler is not None:
            profiler.stop()
            table = profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=30,
                                                  max_name_column_width=60)
            profiler = None
        plan = scheduler.schedule()
        torch.cuda.synchronize()
        start = time.perf_counter()
        outcome = worker.execute(plan)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if all(n == 1 for n in plan.num_scheduled_tokens.values()) and len(plan.num_scheduled_tokens) == batch:
            times.append(elapsed)
        scheduler.update_from_outcome(plan, outcome)
    del engine, worker
    torch.cuda.empty_cache()
    return statistics.median(times) * 1000, table


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_worker_check.json"
    results = {"decode_step_ms": []}
    for batch in (1, 256):
        for eager in (True, False):
            profile_steps = range(20, 40) if batch == 1 and not eager else range(0)
            ms, table = decode_step_ms("Qwen3-0.6B", batch, eager, profile_steps=profile_steps)
            results["decode_step_ms"].append({"shape": "Qwen3-0.6B", "batch": batch, "cuda_graphs": not eager,
                                              "ms": ms})
            print(results["decode_step_ms"][-1], flush=True)
            if table:
                results["batch1_profile"] = table
                print(f"kernels over {len(profile_steps)} steps:\n{table}", flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
