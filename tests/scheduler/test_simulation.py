"""Drives the Scheduler through 1,000 random requests (random lengths, priorities, shared prefixes, cancellations,
deadlines, constraints that fail) against a KV pool small enough to force preemption, with the fake worker of
sched_testkit."""
import random
from collections import deque

import pytest

from sluice.core.errors import InvalidArgument, ResourceExhausted
from sluice.core.finish_reason import FinishReason
from tests.scheduler.sched_testkit import EOS, FakeWorker, make_request, make_scheduler

NUM_REQUESTS = 1000
BLOCK_SIZE = 16
NUM_BLOCKS = 48  # 768 tokens of KV: a few requests at a time
BUDGET = 256
MAX_NUM_SEQS = 32
MAX_PROMPT, MAX_OUTPUT = 160, 48


def _request_specs(rng: random.Random):
    system_prompts = [[rng.randrange(1, 50) for _ in range(length)] for length in (32, 48, 64)]
    specs = []
    for i in range(NUM_REQUESTS):
        prefix = rng.choice(system_prompts) if rng.random() < 0.4 else []
        tail = [rng.randrange(1, 50) for _ in range(rng.randint(1, MAX_PROMPT - len(prefix)))]
        specs.append(dict(request_id=f"r{i}", prompt=prefix + tail, max_tokens=rng.randint(1, MAX_OUTPUT),
                          priority=rng.randint(0, 3), arrival_time=float(i),
                          deadline_in=rng.randint(5, 300) if rng.random() < 0.1 else None,
                          regex="[a-z]+" if rng.random() < 0.1 else None))
    return specs


@pytest.mark.parametrize("steps_in_flight", [1, 2, 3], ids=["synchronous", "async", "async-3"])
def test_random_workload_finishes_every_request_within_a_step_bound(steps_in_flight):
    """With several steps in flight, step N + 1 is planned before step N's outcome is applied, as the engine loop does;
    the fake worker runs the plans in order, feeding its own sampled tokens forward."""
    rng = random.Random(1234)
    scheduler = make_scheduler(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=MAX_NUM_SEQS,
                               max_num_batched_tokens=BUDGET, max_model_len=MAX_PROMPT + MAX_OUTPUT,
                               max_waiting_requests=64)
    worker = FakeWorker(block_size=BLOCK_SIZE, rng=random.Random(7), eos_probability=0.03,
                        grammar_error_probability=0.05)
    specs = _request_specs(rng)
    pending = deque(specs)
    live: set[str] = set()
    finals, received, cancelled = {}, {}, set()

    # Step bound: all tokens at the full token budget, plus one step per output token shared by as many requests
    # as the pool holds side by side on average, with 2x slack (preemption recompute, partial blocks, arrival
    # ramp). Output lengths are their expectation under the worker's EOS probability p: sum_k<m (1-p)^k.
    # (Running one request at a time, max_num_seqs=1, takes about 3.5x what this workload takes, beyond the bound.)
    eos = worker.eos_probability
    total_prompt = sum(len(spec["prompt"]) for spec in specs)
    total_output = sum((1 - (1 - eos) ** spec["max_tokens"]) / eos for spec in specs)
    requests_that_fit = NUM_BLOCKS * BLOCK_SIZE / ((total_prompt + total_output) / NUM_REQUESTS)
    max_steps = int(2 * ((total_prompt + total_output) / BUDGET + total_output / requests_that_fit))

    def record(updates):
        for update in updates:
            received.setdefault(update.request_id, []).extend(update.new_token_ids)
            if update.finished:
                assert update.request_id not in finals
                finals[update.request_id] = update
                live.discard(update.request_id)

    steps = 0
    in_flight = deque()
    requests = {}
    while pending or scheduler.has_unfinished_requests():
        for _ in range(rng.randint(0, 5)):
            if not pending:
                break
            spec = pending[0]
            deadline = None if spec["deadline_in"] is None else steps + spec["deadline_in"]
            request = make_request(spec["request_id"], spec["prompt"], spec["max_tokens"], priority=spec["priority"],
                                   arrival_time=spec["arrival_time"], deadline=deadline, regex=spec["regex"])
            try:
                scheduler.add_request(request)
            except ResourceExhausted:
                break
            live.add(pending.popleft()["request_id"])
            requests[request.request_id] = request
        if live and rng.random() < 0.08:
            request_id = rng.choice(sorted(live))
            record([scheduler.abort_request(request_id)])
            cancelled.add(request_id)
        record(scheduler.expire_deadlines(now=float(steps)))

        plan = scheduler.schedule()
        assert plan.total_num_scheduled_tokens <= BUDGET and len(plan.num_scheduled_tokens) <= MAX_NUM_SEQS
        in_flight.append((plan, worker.execute(plan)))
        while len(in_flight) >= steps_in_flight or (in_flight and not plan.num_scheduled_tokens):
            record(scheduler.update_from_outcome(*in_flight.popleft()))
        load = scheduler.get_load()
        assert load.num_free_blocks + load.num_used_blocks == NUM_BLOCKS
        steps += 1
        assert steps <= max_steps, f"{steps} steps, bound {max_steps}"

    while in_flight:
        record(scheduler.update_from_outcome(*in_flight.popleft()))
    worker.execute(scheduler.schedule())  # delivers the last finished ids
    assert worker.requests == {}
    assert set(finals) == {spec["request_id"] for spec in specs}
    load = scheduler.get_load()
    assert (load.num_running, load.num_waiting, load.num_used_blocks) == (0, 0, 0)
    assert load.num_free_blocks == NUM_BLOCKS
    assert load.num_preemptions > 0
    assert load.prefix_cache_hit_rate > 0
    for spec in specs:
        update, tokens = finals[spec["request_id"]], received.get(spec["request_id"], [])
        assert len(tokens) <= spec["max_tokens"]
        if update.finish_reason is FinishReason.LENGTH:
            assert len(tokens) == spec["max_tokens"]
        if update.finish_reason is FinishReason.STOP:
            assert tokens[-1] == EOS and EOS not in tokens[:-1]
        if update.finish_reason is FinishReason.ERROR:
            assert spec["regex"] is not None and isinstance(update.error, InvalidArgument)
            assert update.error.field == "sampling.regex"
            assert len(worker.sampled_log[spec["request_id"]]) > len(tokens)  # the failing sample is not taken
        else:
            assert update.error is None
        if update.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            # a token sampled in a step still in flight when its request finished or was preempted is dropped
            log, num_preemptions = worker.sampled_log[spec["request_id"]], requests[spec["request_id"]].num_preemptions
            assert 0 <= len(log) - len(tokens) <= (num_preemptions + 1) * (steps_in_flight - 1)
            if num_preemptions == 0:
                assert log[:len(tokens)] == tokens
    reasons = {update.finish_reason for update in finals.values()}
    assert reasons == set(FinishReason)
    print(f"{steps} steps (bound {max_steps}), {load.num_preemptions} preemptions, "
          f"prefix hit rate {load.prefix_cache_hit_rate:.2f}, {len(cancelled)} cancelled")
