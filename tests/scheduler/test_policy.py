import pytest

from sluice.core.errors import InvalidArgument, ResourceExhausted
from sluice.core.finish_reason import FinishReason
from sluice.scheduler.request import RequestStatus
from tests.scheduler.sched_testkit import FakeWorker, make_request, make_scheduler, run_to_completion, step


def _admission_order(policy):
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=1, policy=policy)
    for request_id, priority, arrival in [("low-early", 5, 0), ("high-late", 0, 3), ("mid", 2, 1),
                                          ("high-early", 0, 2)]:
        scheduler.add_request(make_request(request_id, 4, max_tokens=1, priority=priority, arrival_time=arrival))
    worker, order = FakeWorker(block_size=16), []
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, worker)
        order += [new.request_id for new in plan.new_requests]
    return order


def test_priority_policy_runs_lower_value_first_fcfs_within():
    assert _admission_order("priority") == ["high-early", "high-late", "mid", "low-early"]


def test_fcfs_policy_ignores_priority():
    assert _admission_order("fcfs") == ["low-early", "mid", "high-early", "high-late"]


def _two_decoders_in_a_tight_pool(policy, priorities):
    # 4 blocks of 4 tokens; each request's 6-token prompt takes 2 blocks, so the first block crossing forces a
    # preemption
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=16, policy=policy)
    for request_id, priority, arrival in [("early", priorities[0], 0), ("late", priorities[1], 1)]:
        scheduler.add_request(make_request(request_id, 6, max_tokens=6, priority=priority, arrival_time=arrival))
    return scheduler, FakeWorker(block_size=4)


def test_preemption_takes_the_latest_arrival_and_resends_it_whole():
    scheduler, worker = _two_decoders_in_a_tight_pool("fcfs", (0, 0))
    for _ in range(3):  # prefill, then both decode up to the end of their second block
        step(scheduler, worker)
    late = scheduler.get_request("late")
    plan, _ = step(scheduler, worker)  # "early" needs a third block: none free
    assert plan.finished_request_ids == ["late"] and list(plan.num_scheduled_tokens) == ["early"]
    assert late.status is RequestStatus.PREEMPTED and late.num_computed_tokens == 0
    assert scheduler.get_load().num_preemptions == 1
    generated_before = list(late.output_token_ids)
    resent = None
    while resent is None:
        plan, _ = step(scheduler, worker)
        resent = next((new for new in plan.new_requests if new.request_id == "late"), None)
    assert resent.token_ids == late.prompt_token_ids + generated_before
    updates, _ = run_to_completion(scheduler, worker)
    assert {u.request_id for u in updates if u.finished} >= {"late"}
    assert late.num_output_tokens == 6
    assert scheduler.get_load().num_free_blocks == 4


def test_priority_preemption_takes_the_lowest_priority_even_if_earlier():
    scheduler, worker = _two_decoders_in_a_tight_pool("priority", (9, 0))
    for _ in range(3):
        step(scheduler, worker)
    plan, _ = step(scheduler, worker)
    assert "early" in plan.finished_request_ids
    run_to_completion(scheduler, worker)


def test_a_request_the_pool_can_never_hold_is_rejected():
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(InvalidArgument) as error:
        scheduler.add_request(make_request("big", 10, max_tokens=7))
    assert error.value.field == "max_tokens"
    with pytest.raises(InvalidArgument) as error:
        scheduler.add_request(make_request("bigger", 17, max_tokens=1))
    assert error.value.field == "prompt_token_ids"


def test_invalid_requests_are_rejected():
    scheduler = make_scheduler(num_blocks=64, max_model_len=100)
    with pytest.raises(InvalidArgument):
        scheduler.add_request(make_request("empty", [], max_tokens=1))
    with pytest.raises(InvalidArgument) as error:
        scheduler.add_request(make_request("long", 90, max_tokens=11))
    assert error.value.field == "max_tokens"
    scheduler.add_request(make_request("a", 90, max_tokens=10))
    with pytest.raises(InvalidArgument) as error:
        scheduler.add_request(make_request("a", 5))
    assert error.value.field == "request_id"


def test_waiting_bounds_raise_resource_exhausted():
    scheduler = make_scheduler(num_blocks=64, max_waiting_requests=2, max_waiting_tokens=8192)
    scheduler.add_request(make_request("a", 4))
    scheduler.add_request(make_request("b", 4))
    with pytest.raises(ResourceExhausted):
        scheduler.add_request(make_request("c", 4))
    step(scheduler, FakeWorker(block_size=16))  # admitting a and b frees the queue
    scheduler.add_request(make_request("c", 4))

    scheduler = make_scheduler(num_blocks=1024, max_waiting_tokens=8192)
    scheduler.add_request(make_request("a", 8000))
    with pytest.raises(ResourceExhausted):
        scheduler.add_request(make_request("b", 200))
    scheduler.abort_request("a")
    scheduler.add_request(make_request("b", 200))


def test_deadline_expiry_frees_blocks_of_running_and_waiting_requests():
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=1)
    worker = FakeWorker(block_size=16)
    scheduler.add_request(make_request("running", 40, max_tokens=50, deadline=10.0))
    scheduler.add_request(make_request("waiting", 40, max_tokens=50, deadline=12.0))
    scheduler.add_request(make_request("no-deadline", 4, max_tokens=50))
    step(scheduler, worker)
    assert scheduler.get_load().num_used_blocks == 3
    assert scheduler.expire_deadlines(now=9.0) == []
    updates = scheduler.expire_deadlines(now=12.0)
    assert [(u.request_id, u.finish_reason) for u in updates] == [("running", FinishReason.DEADLINE),
                                                                 ("waiting", FinishReason.DEADLINE)]
    assert scheduler.get_load().num_used_blocks == 0
    plan, _ = step(scheduler, worker)
    assert plan.finished_request_ids == ["running"] and list(plan.num_scheduled_tokens) == ["no-deadline"]
    assert scheduler.expire_deadlines(now=100.0) == []


def test_max_model_len_ends_with_length():
    scheduler = make_scheduler(num_blocks=64, max_model_len=12)
    scheduler.add_request(make_request("a", 8, max_tokens=4))
    updates, _ = run_to_completion(scheduler, FakeWorker(block_size=16))
    assert updates[-1].finish_reason is FinishReason.LENGTH
    assert scheduler.get_request("a") is None
