"""How long the scheduler waits for a step's result before it takes the worker group for lost."""
from sluice.core.step_plan import StepPlan
from sluice.scheduler.config import SchedulerConfig


def step_timeout_seconds(plan: StepPlan, config: SchedulerConfig) -> float:
    """The step timeout, growing with the step's tokens up to twice as long for a step of the whole token budget
    (a long prefill), counted from when the step is the oldest in flight."""
    return config.step_timeout * (1 + min(plan.total_num_scheduled_tokens / config.max_num_batched_tokens, 1))
