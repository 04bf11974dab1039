"""How ngram speculation schedules, without a device: the real Scheduler planning up to MAX_STEPS_IN_FLIGHT steps
ahead against the fake worker of the scheduler tests (a token-level KV model, a deterministic "model" that mostly
repeats a cycle), greedy. Prints, per number of requests, the engine steps to finish, tokens per step, proposals
accepted, and the device's waits: outcomes after which no planned step was left to run (the device idles for the
round trip to the scheduler).
Run from the repository root: .venv/bin/python benchmarks/spec_schedule.py [--num-requests 1 4 256]"""
import argparse
import random
import sys
from pathlib import Path

from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT

sys.path.append(str(Path(__file__).parents[1]))  # the tests/ helpers, behind the installed packages
from tests.scheduler.sched_testkit import FakeWorker, cycling_model, make_request, make_scheduler, run_ahead


def run(num_requests: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    scheduler = make_scheduler(num_blocks=40_000, block_size=16, speculative_method="ngram",
                               num_speculative_tokens=3, ngram_min=2, ngram_max=4)
    worker = FakeWorker(block_size=16, model=cycling_model)
    for i in range(num_requests):
        prompt = [3]
        for _ in range(rng.randrange(100, 1024)):  # the cycle, broken at random 30% of the time
            prompt.append(rng.randrange(1, 13) if rng.random() < 0.3 else cycling_model(prompt))
        scheduler.add_request(make_request(f"r{i}", prompt, max_tokens=rng.randrange(100, 1024), ignore_eos=True))
    counts = {"planned": 0, "applied": 0, "waits": 0}

    def on_plan(plan) -> None:
        counts["planned"] += 1

    def on_outcome(plan, outcome) -> None:
        counts["applied"] += 1
        counts["waits"] += counts["applied"] == counts["planned"] and scheduler.has_unfinished_requests()

    updates, steps = run_ahead(scheduler, worker, MAX_STEPS_IN_FLIGHT, on_plan=on_plan, on_outcome=on_outcome)
    tokens = sum(len(update.new_token_ids) for update in updates)
    load = scheduler.get_load()
    return {"steps": steps, "tokens": tokens, "tokens_per_step": tokens / steps,
            "accepted": load.num_accepted_tokens, "proposed": load.num_draft_tokens, "waits": counts["waits"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, nargs="+", default=[1, 4, 256])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for num_requests in args.num_requests:
        result = run(num_requests, args.seed)
        print(f"{num_requests:4d} requests: {result['steps']} steps, {result['tokens']} tokens "
              f"({result['tokens_per_step']:.2f} a step), {result['accepted']} of {result['proposed']} proposed "
              f"tokens accepted, {result['waits']} waits")


if __name__ == "__main__":
    main()
