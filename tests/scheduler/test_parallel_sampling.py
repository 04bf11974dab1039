"""n > 1: samples fork the prompt's KV from sample 0 (full blocks shared, the partial last block copied)."""
import random

import pytest

from sluice.core.finish_reason import FinishReason
from tests.scheduler.sched_testkit import FakeWorker, make_request, make_scheduler, run_to_completion, step

BLOCK_SIZE = 16


def _run(prompt_len: int, n: int = 3, max_tokens: int = 5, num_blocks: int = 64, **config):
    scheduler = make_scheduler(num_blocks=num_blocks, block_size=BLOCK_SIZE, **config)
    worker = FakeWorker(block_size=BLOCK_SIZE)
    scheduler.add_request(make_request("a", prompt_len, max_tokens, n=n, seed=7))
    plans = []
    updates = []
    while scheduler.has_unfinished_requests():
        plan, step_updates = step(scheduler, worker)
        plans.append(plan)
        updates += step_updates
    return scheduler, worker, plans, updates


@pytest.mark.parametrize("prompt_len, num_copies", [(20, 2), (17, 0), (40, 2), (1, 0)])
def test_samples_fork_the_prompt_and_each_finish(prompt_len, num_copies):
    scheduler, worker, plans, updates = _run(prompt_len)
    assert sum(len(plan.block_copies) for plan in plans) == num_copies
    # the prompt short of its last token once, then per sample the last prompt token and 4 decodes
    assert sum(plan.total_num_scheduled_tokens for plan in plans) == prompt_len - 1 + 3 * 5
    forked = [new for plan in plans for new in plan.new_requests if new.request_id != "a#0"]
    assert [new.num_computed_tokens for new in forked] == [prompt_len - 1] * 2
    finished = {u.sample_index: u for u in updates if u.finished}
    assert sorted(finished) == [0, 1, 2] and {u.request_id for u in updates} == {"a"}
    assert all(u.num_output_tokens == 5 and u.finish_reason is FinishReason.LENGTH for u in finished.values())
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_total_blocks


def test_sample_seeds_follow_the_request_seed():
    _, _, plans, _ = _run(20)
    seeds = {new.request_id: new.sampling_params.seed for plan in plans for new in plan.new_requests}
    assert seeds == {"a#0": 7, "a#1": 8, "a#2": 9}


def test_finish_samples_ends_one_sample_or_all():
    scheduler = make_scheduler(num_blocks=64, block_size=BLOCK_SIZE)
    worker = FakeWorker(block_size=BLOCK_SIZE)
    scheduler.add_request(make_request("a", 20, 50, n=3))
    for _ in range(4):
        step(scheduler, worker)
    stopped = scheduler.finish_samples("a", FinishReason.STOP, sample_index=1)
    assert [(u.sample_index, u.finish_reason) for u in stopped] == [(1, FinishReason.STOP)]
    aborted = scheduler.finish_samples("a", FinishReason.ABORT)
    assert sorted(u.sample_index for u in aborted) == [0, 2]
    assert not scheduler.has_unfinished_requests()
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_total_blocks


def test_abort_before_the_fork_ends_every_sample():
    scheduler = make_scheduler(num_blocks=64, block_size=BLOCK_SIZE, max_num_batched_tokens=8)
    worker = FakeWorker(block_size=BLOCK_SIZE)
    scheduler.add_request(make_request("a", 40, 5, n=4))
    step(scheduler, worker)
    assert len(scheduler.finish_samples("a", FinishReason.ABORT)) == 4
    assert not scheduler.has_unfinished_requests()


def test_without_a_block_for_the_copy_a_sample_prefills_on_its_own():
    # 2 blocks: sample 0's prompt fills them, nothing to spare for a copy until it finishes
    scheduler, worker, plans, updates = _run(20, n=2, max_tokens=2, num_blocks=2)
    assert sum(len(plan.block_copies) for plan in plans) == 0
    assert sorted(u.sample_index for u in updates if u.finished) == [0, 1]
    assert all(u.num_output_tokens == 2 for u in updates if u.finished)


def test_prompt_logprobs_skip_the_prefix_cache():
    scheduler = make_scheduler(num_blocks=64, block_size=BLOCK_SIZE)
    worker = FakeWorker(block_size=BLOCK_SIZE)
    prompt = list(range(100, 140))
    scheduler.add_request(make_request("warm", prompt, 1))
    run_to_completion(scheduler, worker)
    scheduler.add_request(make_request("hit", prompt, 1))
    scheduler.add_request(make_request("logprobs", prompt, 1, prompt_logprobs=0))
    plan = scheduler.schedule()
    computed = {new.request_id: new.num_computed_tokens for new in plan.new_requests}
    assert computed == {"hit": 32, "logprobs": 0}


def test_prompt_logprobs_arrive_once_per_prompt_token_through_chunks_and_preemption():
    scheduler = make_scheduler(num_blocks=10, block_size=4, max_num_batched_tokens=6, max_model_len=40)
    worker = FakeWorker(block_size=4)
    prompts = {f"r{i}": list(range(10 * i + 1, 10 * i + 15)) for i in range(3)}
    for request_id, prompt in prompts.items():
        scheduler.add_request(make_request(request_id, prompt, 10, prompt_logprobs=0, ignore_eos=True))
    updates, _ = run_to_completion(scheduler, worker)
    assert scheduler.get_load().num_preemptions > 0
    for request_id, prompt in prompts.items():
        received = [token for u in updates if u.request_id == request_id and u.prompt_logprobs is not None
                    for token in u.prompt_logprobs.token_ids]
        assert received == prompt[1:]


def test_random_parallel_sampling_under_preemption_and_aborts_finishes_every_sample():
    rng = random.Random(5)
    scheduler = make_scheduler(num_blocks=24, block_size=4, max_num_batched_tokens=24, max_num_seqs=8,
                               max_model_len=64)
    worker = FakeWorker(block_size=4, rng=random.Random(1), eos_probability=0.05)
    expected_samples = {}
    for i in range(40):
        n = rng.randint(1, 4)
        expected_samples[f"r{i}"] = n
        scheduler.add_request(make_request(f"r{i}", rng.randint(1, 30), rng.randint(1, 12), n=n,
                                           arrival_time=float(i)))
    finished, steps = {}, 0
    while scheduler.has_unfinished_requests():
        _, updates = step(scheduler, worker)
        if rng.random() < 0.05:
            updates += scheduler.finish_samples(f"r{rng.randrange(40)}", FinishReason.ABORT)
        for update in updates:
            if update.finished:
                assert (update.request_id, update.sample_index) not in finished
                finished[update.request_id, update.sample_index] = update
        steps += 1
        assert steps < 5000
    assert sorted(finished) == sorted((rid, i) for rid, n in expected_samples.items() for i in range(n))
    assert scheduler.get_load().num_preemptions > 0
    assert scheduler.block_manager.num_free_blocks == scheduler.block_manager.num_total_blocks
