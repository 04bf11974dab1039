"""How ngram speculation schedules, without a device: the real Scheduler planning up to MAX_STEPS_IN_FLIGHT steps
ahead against the fake worker of the scheduler tests (a token-level KV model, a deterministic "model" that mostly
repeats a cycle), greedy. Prints, per number of requests, the engine steps to finish, tokens per step, proposals
accepted, and the device's waits: outcomes after which no planned step was left to run (the device idles for the
round trip to the scheduler).
Run from the repository root: PYTHONPATH=. python benchmarks/spec_schedule.py [--num-requests 1 4 256]"""
import argparse
import random
from collections import deque

from scheduler_svc.scheduler import MAX_STEPS_IN_FLIGHT
from tests.scheduler.sched_testkit import FakeWorker, make_request, make_scheduler


def cycling_model(context: list[int]) -> int:
    return 1 + (context[-1] * 5 + (2 if len(context) % 7 == 0 else 1)) % 12


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
    in_flight, steps, tokens, waits = deque(), 0, 0, 0
    while scheduler.has_unfinished_requests() or in_flight:
        while len(in_flight) < MAX_STEPS_IN_FLIGHT and scheduler.has_unfinished_requests():
            plan = scheduler.schedule()
            if plan.is_empty:
                break
            in_flight.append((plan, worker.execute(plan)))
        tokens += sum(len(update.new_token_ids) for update in scheduler.update_from_outcome(*in_flight.popleft()))
        steps += 1
        waits += not in_flight and scheduler.has_unfinished_requests()
    load = scheduler.get_load()
    return {"steps": steps, "tokens": tokens, "tokens_per_step": tokens / steps,
            "accepted": load.num_accepted_tokens, "proposed": load.num_draft_tokens, "waits": waits}


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
