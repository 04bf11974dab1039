"""Measures the CPU cost of planning one step (schedule()) and of applying its outcome (update_from_outcome()) with
N running decode requests. Run: python benchmarks/schedule.py [--num-requests 256]"""
import argparse
import statistics
import time

from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import StepOutcome
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import Scheduler


def bench(num_requests: int, prompt_len: int, num_steps: int, block_size: int) -> dict[str, float]:
    max_tokens = num_steps + 1000  # decodes also run during the prefill warm-up
    blocks_per_request = -(-(prompt_len + max_tokens) // block_size)
    config = SchedulerConfig(num_blocks=num_requests * blocks_per_request, block_size=block_size,
                             max_num_seqs=num_requests, max_num_batched_tokens=max(8192, num_requests),
                             max_model_len=prompt_len + max_tokens)
    scheduler = Scheduler(config, eos_token_ids={0})
    for i in range(num_requests):
        prompt = [1 + (i * 7919 + j) % 30000 for j in range(prompt_len)]
        scheduler.add_request(Request(f"req-{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                      arrival_time=float(i)))
    while True:  # prefill everything, so every measured step is all decodes
        plan = scheduler.schedule()
        scheduler.update_from_outcome(plan, StepOutcome(plan.step_id, {r: 1 for r in plan.num_scheduled_tokens}))
        if not plan.new_requests and all(n == 1 for n in plan.num_scheduled_tokens.values()):
            break
    schedule_us, update_us = [], []
    for step in range(num_steps):
        start = time.perf_counter()
        plan = scheduler.schedule()
        planned = time.perf_counter()
        outcome = StepOutcome(plan.step_id, {r: 1 + step % 30000 for r in plan.num_scheduled_tokens})
        applied_start = time.perf_counter()
        scheduler.update_from_outcome(plan, outcome)
        end = time.perf_counter()
        assert len(plan.num_scheduled_tokens) == num_requests
        schedule_us.append((planned - start) * 1e6)
        update_us.append((end - applied_start) * 1e6)
    return {
        "schedule_median_us": statistics.median(schedule_us),
        "schedule_p99_us": statistics.quantiles(schedule_us, n=100)[98],
        "update_median_us": statistics.median(update_us),
        "update_p99_us": statistics.quantiles(update_us, n=100)[98],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--num-steps", type=int, default=500)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    result = bench(args.num_requests, args.prompt_len, args.num_steps, args.block_size)
    print(f"{args.num_requests} running decodes, {args.num_steps} steps: "
          + ", ".join(f"{key} {value:.1f}" for key, value in result.items()))


if __name__ == "__main__":
    main()
