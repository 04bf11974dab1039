"""Time one sampling step (the worker's SamplingRows gather + sample, and logprobs where asked) for a batch of rows:
`python benchmarks/sampling.py [--device cuda] [--batch 256] [--vocab 151936] [--profile] [--gather-only]`. Prints the
median per setting, with --profile the operators that take its device time, and with --gather-only the time of the
gather alone (the step's host work of finding what its rows need)."""
import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from sluice.core.sampling_params import SamplingParams
from sluice.worker.sampling.rows import SamplingRows
from sluice.worker.sampling.step import StepSampler
from sluice.worker.sampling.structured_output import GrammarMatchers

SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature 0.8, top-p 0.95, top-k 50": SamplingParams(temperature=0.8, top_p=0.95, top_k=50),
    "temperature 0.8, top-p 0.95": SamplingParams(temperature=0.8, top_p=0.95),
    "temperature 0.7, penalties, logprobs 5": SamplingParams(temperature=0.7, repetition_penalty=1.1,
                                                             frequency_penalty=0.2, logprobs=5),
}


def _time_step(sampler: StepSampler, request_ids: list[str], logits: torch.Tensor, device: torch.device) -> float:
    rows = torch.tensor(sampler.rows.indices(request_ids), device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    sample = sampler.sample(logits.clone(), request_ids, rows)
    sampler.finish(sample, sample.token_ids.tolist())
    return time.perf_counter() - started


def _time_gather(sampler: StepSampler, request_ids: list[str], logits: torch.Tensor, device: torch.device) -> float:
    rows = torch.tensor(sampler.rows.indices(request_ids), device=device)
    started = time.perf_counter()
    sampler.rows.gather(request_ids, rows)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--gather-only", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    logits = torch.randn(args.batch, args.vocab, device=device) * 3
    for name, params in SETTINGS.items():
        sampler = StepSampler(SamplingRows(args.vocab, (0,), device), GrammarMatchers(None, args.vocab, device))
        request_ids = [f"r{i}" for i in range(args.batch)]
        for i, request_id in enumerate(request_ids):
            sampler.rows.add(request_id, params, i, [1, 2, 3], [])
        timed = _time_gather if args.gather_only else _time_step
        times = [timed(sampler, request_ids, logits, device) for _ in range(args.steps)]
        print(f"{name:42} {statistics.median(times[3:]) * 1000:8.3f} ms per {'gather' if args.gather_only else 'step'} "
              f"(batch {args.batch}, vocab {args.vocab}, {device})", flush=True)
        if args.profile:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            with profile(activities=activities) as profiled:
                for _ in range(5):
                    _time_step(sampler, request_ids, logits, device)
            sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(profiled.key_averages().table(sort_by=sort_by, row_limit=12), flush=True)


if __name__ == "__main__":
    main()
