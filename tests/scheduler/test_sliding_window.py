"""A model whose every layer has a sliding window: the blocks before a request's window go back to the pool as it
advances, while every query's window still holds its own tokens (the fake worker checks each one), through prefix
hits, forks of n > 1 samples, preemption, speculation and steps in flight."""
import random

import pytest

from tests.scheduler.sched_testkit import FakeWorker, cycling_model, make_request, make_scheduler, run_ahead

BLOCK_SIZE = 4
WINDOW = 10


def _peak_blocks(attention_window: int) -> int:
    scheduler = make_scheduler(num_blocks=64, block_size=BLOCK_SIZE, max_num_batched_tokens=16,
                               attention_window=attention_window)
    worker = FakeWorker(block_size=BLOCK_SIZE, attention_window=attention_window)
    scheduler.add_request(make_request("long", 30, max_tokens=90))
    peak = 0

    def count(plan, outcome):
        nonlocal peak
        peak = max(peak, scheduler.block_manager.num_used_blocks)

    run_ahead(scheduler, worker, steps_in_flight=2, on_outcome=count)
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_total_blocks
    return peak


def test_a_request_holds_the_blocks_of_its_window_only():
    assert _peak_blocks(0) == 120 // BLOCK_SIZE
    # the window's blocks, the chunk being computed (16 tokens of prefill), the slot ahead for the step in flight
    assert _peak_blocks(WINDOW) <= -(-(WINDOW + 16) // BLOCK_SIZE) + 2


@pytest.mark.parametrize("speculative_method", [None, "ngram"])
def test_random_workload_keeps_every_window(speculative_method):
    rng = random.Random(11)
    scheduler = make_scheduler(num_blocks=28, block_size=BLOCK_SIZE, max_num_batched_tokens=24, max_num_seqs=8,
                               max_model_len=96, attention_window=WINDOW, speculative_method=speculative_method)
    worker = FakeWorker(block_size=BLOCK_SIZE, rng=random.Random(3), eos_probability=0.02, model=cycling_model,
                        attention_window=WINDOW)
    shared = [rng.randrange(1, 13) for _ in range(16)]
    for i in range(60):
        prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(1, 13) for _ in range(rng.randint(1, 40))]
        scheduler.add_request(make_request(f"r{i}", prompt, rng.randint(1, 40), n=rng.choice([1, 1, 2, 3]),
                                           arrival_time=float(i)))
    run_ahead(scheduler, worker, steps_in_flight=2)
    load = scheduler.get_load()
    assert load.num_preemptions > 0 and scheduler.block_manager.prefix_cache_hit_rate > 0
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_total_blocks
