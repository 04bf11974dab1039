"""Where the CPU path's time goes: the offline engine (the real Scheduler and WorkerEngine in one process) generates
a `sluice bench throughput` workload under torch's profiler, and its operators' CPU time is summed by kind:
projections (the linear layers' GEMMs), attention (the context's gather, its products or flash kernel, softmax),
other operators (norms, rotary, activations, sampling), and the host's Python around them (the run's time less
all operators', on as many threads). The profiler's own cost inflates the small operators' share. The gRPC hops are the difference between `sluice bench throughput` and its `--in-process`.
Prints JSON. Run from the repository root: .venv/bin/python benchmarks/cpu_step_profile.py [--dtype bfloat16]
[--kernels torch] [--threads 1] [--top 20] [--num-requests 32 --input-len 64 256 --output-len 32 128]."""
import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sluice.cli.bench.workload import random_workload
from sluice.cli.model_store import default_model
from sluice.cli.offline import OfflineEngine
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

KINDS = {
    "projections": ("mkldnn::_linear_pointwise", "aten::mm", "aten::addmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm", "aten::index_select", "aten::index",
                  "aten::masked_fill", "aten::_softmax", "aten::_index_put_impl_"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kernels", default="auto")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, nargs=2, default=(64, 256))
    parser.add_argument("--output-len", type=int, nargs=2, default=(32, 128))
    parser.add_argument("--top", type=int, default=0, help="also list this many operators, by their CPU time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    worker = WorkerEngine.load(WorkerConfig(model=str(default_model()), dtype=args.dtype, kernels=args.kernels))
    engine = OfflineEngine(worker)
    vocab_size = worker.model_config.vocab_size
    workload = random_workload(args.num_requests, tuple(args.input_len), tuple(args.output_len), vocab_size, 0)
    _generate(engine, random_workload(4, tuple(args.input_len), tuple(args.output_len), vocab_size, 1))
    steps_before = engine.num_steps
    started, cpu_started = time.perf_counter(), time.process_time()
    output_tokens = _generate(engine, workload)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    steps = engine.num_steps - steps_before
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        profiled_started = time.perf_counter()
        _generate(engine, workload)
        profiled_wall = time.perf_counter() - profiled_started
    seconds = {kind: 0.0 for kind in (*KINDS, "other operators")}
    events = profiler.key_averages()
    for event in events:
        kind = next((kind for kind, names in KINDS.items() if event.key in names), "other operators")
        seconds[kind] += event.self_cpu_time_total / 1e6
    seconds["host, outside operators"] = max(0.0, profiled_wall * args.threads - sum(seconds.values()))
    total = sum(seconds.values())
    print(json.dumps({"dtype": args.dtype, "kernels": args.kernels, "threads": args.threads,
                      "output_tokens": output_tokens, "steps": steps,
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "output_tokens_per_cpu_s": round(
                          output_tokens / cpu, 1),
                      "share_of_profiled_time": {kind: round(value / total, 3) for kind, value in seconds.items()},
                      "top_operators": {event.key: round(event.self_cpu_time_total / 1e6 / total, 3) for event in
                                        sorted(events, key=lambda e: -e.self_cpu_time_total)[:args.top]}}))


def _generate(engine: OfflineEngine, requests) -> int:
    results = engine.generate([r.prompt_token_ids for r in requests], [r.sampling_params() for r in requests])
    return sum(len(result.token_ids) for result in results)


if __name__ == "__main__":
    main()
