import pytest

from sluice.core.finish_reason import FinishReason
from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT
from tests.scheduler.sched_testkit import EOS, FakeWorker, make_request, make_scheduler, run_to_completion, step


def test_single_request_runs_to_max_tokens():
    scheduler = make_scheduler(num_blocks=16)
    scheduler.add_request(make_request("a", 20, max_tokens=5))
    worker = FakeWorker(block_size=16)
    updates, steps = run_to_completion(scheduler, worker)
    assert steps == 5
    assert [len(u.new_token_ids) for u in updates] == [1] * 5
    assert updates[-1].finish_reason is FinishReason.LENGTH
    assert updates[-1].num_prompt_tokens == 20
    assert scheduler.get_load().num_free_blocks == 16


def test_first_plan_sends_whole_request_then_diffs():
    scheduler = make_scheduler(num_blocks=16)
    scheduler.add_request(make_request("a", 20, max_tokens=20))
    worker = FakeWorker(block_size=16)
    plan, _ = step(scheduler, worker)
    assert [new.request_id for new in plan.new_requests] == ["a"]
    assert plan.new_requests[0].block_ids == [0, 1] and plan.num_scheduled_tokens == {"a": 20}
    plan, _ = step(scheduler, worker)
    assert plan.new_requests == [] and plan.num_scheduled_tokens == {"a": 1}
    assert plan.cached_requests[0].num_computed_tokens == 20 and plan.cached_requests[0].new_block_ids == []
    for _ in range(12):
        plan, _ = step(scheduler, worker)
    assert plan.cached_requests[0].num_computed_tokens == 32 and plan.cached_requests[0].new_block_ids == [2]


def test_chunked_prefill_splits_long_prompt_under_budget():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=32)
    scheduler.add_request(make_request("long", 100, max_tokens=2))
    worker = FakeWorker(block_size=16)
    chunks = []
    for _ in range(4):
        plan, updates = step(scheduler, worker)
        chunks.append(plan.num_scheduled_tokens["long"])
        assert plan.total_num_scheduled_tokens <= 32
    assert chunks == [32, 32, 32, 4]
    assert len(updates) == 1 and len(updates[0].new_token_ids) == 1  # only the last chunk samples


def test_decodes_share_the_step_with_a_prefill_chunk_decodes_first():
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=32)
    worker = FakeWorker(block_size=16)
    scheduler.add_request(make_request("d1", 8, max_tokens=50, arrival_time=0))
    scheduler.add_request(make_request("d2", 8, max_tokens=50, arrival_time=1))
    step(scheduler, worker)
    scheduler.add_request(make_request("long", 100, max_tokens=2, arrival_time=2))
    plan, _ = step(scheduler, worker)
    assert list(plan.num_scheduled_tokens.items()) == [("d1", 1), ("d2", 1), ("long", 30)]
    plan, _ = step(scheduler, worker)
    assert list(plan.num_scheduled_tokens.items()) == [("d1", 1), ("d2", 1), ("long", 30)]
    assert [c.request_id for c in plan.cached_requests] == ["d1", "d2", "long"]


def test_continuous_batching_admits_new_requests_as_others_finish():
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=2)
    worker = FakeWorker(block_size=16)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", 4, max_tokens=3 + i, arrival_time=i))
    plan, _ = step(scheduler, worker)
    assert set(plan.num_scheduled_tokens) == {"r0", "r1"}
    seen_together = []
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, worker)
        assert len(plan.num_scheduled_tokens) <= 2
        seen_together.append(set(plan.num_scheduled_tokens))
    assert {"r1", "r2"} in seen_together  # r2 joined while r1 still decoded


def test_eos_stops_but_not_before_min_tokens_nor_with_ignore_eos():
    for params, expected_len, reason in [({}, 1, FinishReason.STOP), ({"min_tokens": 3}, 3, FinishReason.STOP),
                                         ({"ignore_eos": True}, 6, FinishReason.LENGTH)]:
        scheduler = make_scheduler(num_blocks=16)
        scheduler.add_request(make_request("a", 4, max_tokens=6, **params))
        updates, _ = run_to_completion(scheduler, FakeWorker(block_size=16, eos_probability=1.0))
        tokens = [t for u in updates for t in u.new_token_ids]
        assert tokens == [EOS] * expected_len and updates[-1].finish_reason is reason


def test_stop_token_ids_stop():
    scheduler = make_scheduler(num_blocks=16)
    scheduler.add_request(make_request("a", 4, max_tokens=100, stop_token_ids=list(range(1, 50))))
    updates, _ = run_to_completion(scheduler, FakeWorker(block_size=16, vocab=50))
    assert len(updates) == 1 and updates[0].finish_reason is FinishReason.STOP


def test_abort_frees_blocks_and_tells_the_worker_next_plan():
    scheduler = make_scheduler(num_blocks=16)
    worker = FakeWorker(block_size=16)
    scheduler.add_request(make_request("a", 40, max_tokens=10))
    step(scheduler, worker)
    assert scheduler.get_load().num_used_blocks == 3
    update = scheduler.abort_request("a")
    assert update.finish_reason is FinishReason.ABORT and update.new_token_ids == []
    assert scheduler.get_load().num_used_blocks == 0
    assert scheduler.abort_request("a") is None
    plan = scheduler.schedule()
    assert plan.finished_request_ids == ["a"] and not plan.num_scheduled_tokens
    assert not scheduler.has_unfinished_requests()


def test_abort_while_step_in_flight_is_ignored_by_update():
    scheduler = make_scheduler(num_blocks=16)
    worker = FakeWorker(block_size=16)
    scheduler.add_request(make_request("a", 4, max_tokens=10))
    plan = scheduler.schedule()
    scheduler.abort_request("a")
    assert scheduler.update_from_outcome(plan, worker.execute(plan)) == []
    assert scheduler.get_load().num_free_blocks == 16


def test_router_can_finish_with_stop():
    scheduler = make_scheduler(num_blocks=16)
    scheduler.add_request(make_request("a", 4, max_tokens=10))
    step(scheduler, FakeWorker(block_size=16))
    assert scheduler.finish_request("a", FinishReason.STOP).finish_reason is FinishReason.STOP
    assert not scheduler.has_unfinished_requests()


def test_steps_are_planned_ahead_up_to_the_limit():
    scheduler = make_scheduler(num_blocks=16)
    scheduler.add_request(make_request("a", 4, max_tokens=MAX_STEPS_IN_FLIGHT + 1))
    worker = FakeWorker(block_size=16)
    plans = [scheduler.schedule() for _ in range(MAX_STEPS_IN_FLIGHT)]
    assert [p.num_scheduled_tokens for p in plans] == [{"a": 4}] + [{"a": 1}] * (MAX_STEPS_IN_FLIGHT - 1)
    # the worker feeds its own sampled tokens forward
    assert [p.cached_requests[0].num_computed_tokens for p in plans[1:]] == list(range(4, 3 + MAX_STEPS_IN_FLIGHT))
    with pytest.raises(RuntimeError):
        scheduler.schedule()
    outcomes = [worker.execute(plan) for plan in plans]
    updates = scheduler.update_from_outcome(plans[0], outcomes[0])
    last = scheduler.schedule()  # the tokens in flight leave room for one more
    for plan, outcome in zip(plans[1:], outcomes[1:]):
        updates += scheduler.update_from_outcome(plan, outcome)
    assert scheduler.schedule().num_scheduled_tokens == {}  # the last token is in flight
    updates += scheduler.update_from_outcome(last, worker.execute(last))
    assert [u.new_token_ids[0] for u in updates] == worker.sampled_log["a"]
    assert updates[-1].finish_reason is FinishReason.LENGTH


def test_outcome_of_another_step_is_refused():
    scheduler = make_scheduler(num_blocks=16)
    scheduler.add_request(make_request("a", 4))
    plan = scheduler.schedule()
    outcome = FakeWorker(block_size=16).execute(plan)
    outcome.step_id += 1
    with pytest.raises(ValueError):
        scheduler.update_from_outcome(plan, outcome)


@pytest.mark.parametrize("bad", [dict(num_blocks=0), dict(block_size=0), dict(policy="lottery"),
                                 dict(max_num_batched_tokens=0), dict(max_waiting_tokens=10)])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        make_scheduler(**({"num_blocks": 16} | bad))


def test_abort_all_leaves_nothing_for_a_new_worker():
    scheduler = make_scheduler(num_blocks=16)
    worker = FakeWorker(block_size=16)
    scheduler.add_request(make_request("shared", 40, max_tokens=10))
    run_to_completion(scheduler, worker)  # leaves its prompt in the prefix cache
    scheduler.add_request(make_request("running", 40, max_tokens=10))
    scheduler.add_request(make_request("pair", 20, max_tokens=10, n=2))
    step(scheduler, worker)
    scheduler.add_request(make_request("waiting", 4, max_tokens=10))
    scheduler.schedule()  # a step in flight when the worker is lost
    updates = scheduler.abort_all()
    assert sorted((u.request_id, u.sample_index) for u in updates) == [
        ("pair", 0), ("pair", 1), ("running", 0), ("waiting", 0)]
    assert all(u.finish_reason is FinishReason.ABORT for u in updates)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.get_load().num_free_blocks == 16

    new_worker = FakeWorker(block_size=16)
    scheduler.add_request(make_request("shared", 40, max_tokens=2))
    plan, _ = step(scheduler, new_worker)
    assert plan.finished_request_ids == [] and plan.new_requests[0].num_computed_tokens == 0
    updates, _ = run_to_completion(scheduler, new_worker)
    assert updates[-1].finish_reason is FinishReason.LENGTH
