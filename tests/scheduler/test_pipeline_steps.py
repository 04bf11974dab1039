"""The scheduler over a pipeline of P stages: up to P steps in flight, none holding a request that another holds, each
with a share of the running requests; so on a stand-in pipeline whose stages each take a fixed time per step, two
steps in flight at -pp 2 run nearly twice the steps per second of one, and the requests get the tokens they get at
-pp 1."""
from sluice.scheduler.pipeline_depth import PipelineDepth
from sluice.scheduler.steps_in_flight import StepsInFlight
from tests.scheduler.sched_testkit import FakeWorker, cycling_model, make_request, make_scheduler, run_ahead

STAGE_SECONDS = 0.010


class StandInPipeline:
    """Stages that each take STAGE_SECONDS per step, in step order, on a clock of their own: a step enters the
    first stage when it is sent and that stage is free, and its outcome (the fake worker's) arrives when it leaves
    the last."""

    def __init__(self, num_stages: int, worker: FakeWorker):
        self.worker = worker
        self.now = 0.0
        self._free_at = [0.0] * num_stages

    def send(self, plan):
        leaves = self.now
        for stage, free_at in enumerate(self._free_at):
            leaves = self._free_at[stage] = max(leaves, free_at) + STAGE_SECONDS
        return leaves, self.worker.execute(plan)


def _steps_per_second(steps_in_flight: int) -> float:
    scheduler = make_scheduler(num_blocks=256, block_size=4, pipeline_parallel_size=2)
    for i in range(8):
        scheduler.add_request(make_request(f"r{i}", 6, max_tokens=40, ignore_eos=True))
    pipeline = StandInPipeline(2, FakeWorker(block_size=4, model=cycling_model))
    steps, num_steps = StepsInFlight(scheduler, pipeline.send), 0
    while scheduler.has_unfinished_requests():
        while steps.send_next(steps_in_flight):
            pass
        leaves, outcome = steps.oldest.sent
        pipeline.now = max(pipeline.now, leaves)
        steps.apply_oldest(outcome)
        num_steps += 1
    return num_steps / pipeline.now


def test_two_steps_in_flight_at_pp2_run_nearly_twice_the_steps_per_second_of_one():
    depth = PipelineDepth(num_stages=2)
    assert depth.limit >= 2
    assert _steps_per_second(depth.limit) >= 1.8 * _steps_per_second(1)


def test_no_request_is_in_two_steps_in_flight_and_the_tokens_are_those_of_one_stage():
    def requests():
        return [make_request(f"r{i}", 5 + 3 * i, max_tokens=12) for i in range(6)]

    def run(pipeline_parallel_size: int, steps_in_flight: int, on_plan=None, on_outcome=None):
        scheduler = make_scheduler(num_blocks=64, block_size=4, pipeline_parallel_size=pipeline_parallel_size)
        for request in requests():
            scheduler.add_request(request)
        updates, _ = run_ahead(scheduler, FakeWorker(block_size=4, model=cycling_model), steps_in_flight,
                               on_plan=on_plan, on_outcome=on_outcome)
        tokens = {}
        for update in updates:
            tokens.setdefault((update.request_id, update.sample_index), []).extend(update.new_token_ids)
        return tokens

    in_flight: dict[int, set[str]] = {}

    def on_plan(plan):
        held = set().union(*in_flight.values())
        assert held.isdisjoint(plan.num_scheduled_tokens), f"step {plan.step_id} plans requests in flight"
        in_flight[plan.step_id] = set(plan.num_scheduled_tokens)

    assert run(2, 2, on_plan, lambda plan, outcome: in_flight.pop(plan.step_id)) == run(1, 1)


def test_forked_samples_run_in_the_step_of_their_fork_beyond_its_share():
    """The 3 samples forked while their parent's step is in flight: the step's share is 2 of the 4 running, but a
    sample is sent to the worker with its block copies only in the step that forks it."""
    scheduler = make_scheduler(num_blocks=64, block_size=4, pipeline_parallel_size=2)
    scheduler.add_request(make_request("forked", 9, max_tokens=12, n=4, temperature=0.0))
    updates, _ = run_ahead(scheduler, FakeWorker(block_size=4, model=cycling_model), 2)
    tokens = {}
    for update in updates:
        tokens.setdefault(update.sample_index, []).extend(update.new_token_ids)
    assert len(tokens) == 4 and all(sample == tokens[0] and len(sample) == 12 for sample in tokens.values())
