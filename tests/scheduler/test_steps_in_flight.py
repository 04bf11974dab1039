"""StepsInFlight, the step loop the engine loop and the offline engine share: plans are sent up to the caller's limit,
an empty plan is not sent, and outcomes are applied oldest first."""
from sluice.scheduler.steps_in_flight import StepsInFlight
from tests.scheduler.sched_testkit import FakeWorker, make_request, make_scheduler


def test_steps_are_sent_up_to_the_limit_and_applied_oldest_first():
    scheduler, worker, sent = make_scheduler(num_blocks=16), FakeWorker(block_size=16), []
    steps = StepsInFlight(scheduler, lambda plan: sent.append(plan) or worker.execute(plan))
    assert not steps.send_next(2) and not steps  # nothing to plan: nothing sent
    scheduler.add_request(make_request("a", 4, max_tokens=3))
    assert steps.send_next(2) and steps.send_next(2)
    assert not steps.send_next(2) and len(steps) == 2  # at the limit: nothing planned
    assert [plan.num_scheduled_tokens for plan in sent] == [{"a": 4}, {"a": 1}]
    plan, outcome = steps.oldest
    assert plan is sent[0]
    updates = steps.apply_oldest(outcome)
    assert [update.new_token_ids for update in updates] == [worker.sampled_log["a"][:1]] and len(steps) == 1
    assert steps.send_next(2)  # the last token
    while steps:
        updates += steps.apply_oldest(steps.oldest.sent)
    assert [token for update in updates for token in update.new_token_ids] == worker.sampled_log["a"]
    assert updates[-1].finished and not scheduler.has_unfinished_requests()
