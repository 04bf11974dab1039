from sluice.scheduler.pipeline_depth import PipelineDepth
from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT


def _run_steps(depth: PipelineDepth, step_ms: float, turnaround_ms: float, steps: int = 20, start_ms: float = 0.0):
    for i in range(steps):
        outcome_at = (start_ms + i * step_ms) / 1000
        depth.outcome_received(outcome_at)
        depth.plan_sent(outcome_at + turnaround_ms / 1000)
        depth.plan_sent(outcome_at + 0.9 * step_ms / 1000)  # a later plan after the same outcome is no turnaround


def test_long_steps_with_a_quick_scheduler_keep_one_step_queued():
    depth = PipelineDepth()
    assert depth.limit == MAX_STEPS_IN_FLIGHT  # nothing measured yet
    _run_steps(depth, step_ms=6.5, turnaround_ms=0.6)
    assert depth.limit == 2


def test_short_steps_keep_the_deeper_pipeline():
    depth = PipelineDepth()
    _run_steps(depth, step_ms=0.9, turnaround_ms=0.1)
    assert depth.limit == MAX_STEPS_IN_FLIGHT


def test_a_busy_scheduler_keeps_the_deeper_pipeline():
    depth = PipelineDepth()
    _run_steps(depth, step_ms=8.0, turnaround_ms=2.5)
    assert depth.limit == MAX_STEPS_IN_FLIGHT
    _run_steps(depth, step_ms=8.0, turnaround_ms=1.0, start_ms=1000.0)
    assert depth.limit == 2


def test_time_without_work_is_not_a_step():
    depth = PipelineDepth()
    _run_steps(depth, step_ms=1.0, turnaround_ms=0.1)
    depth.idled()
    _run_steps(depth, step_ms=1.0, turnaround_ms=0.1, steps=2, start_ms=5000.0)
    assert depth.step_seconds < 0.002
    assert depth.limit == MAX_STEPS_IN_FLIGHT
