"""Steps sent to the worker and not yet applied: the in-flight step loop of the engine loop and the offline engine."""
from collections import deque
from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar

from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.scheduler.outputs import RequestUpdate
from sluice.scheduler.scheduler import Scheduler

Sent = TypeVar("Sent")


class SentStep(NamedTuple, Generic[Sent]):
    plan: StepPlan
    sent: Sent  # what sending the plan returned: the worker's handle of the step, or None


class StepsInFlight(Generic[Sent]):
    """Async scheduling: step N + 1 is planned and sent while step N runs, so the worker finds its next step waiting,
    and outcomes are applied oldest first, in the order their steps were sent. The caller says how many steps may be
    in flight (at most the scheduler's MAX_STEPS_IN_FLIGHT) and collects each outcome its own way: awaited from the
    worker's stream, or finished in process."""

    def __init__(self, scheduler: Scheduler, send: Callable[[StepPlan], Sent]):
        self.scheduler = scheduler
        self._send = send
        self._steps: deque[SentStep[Sent]] = deque()

    def __len__(self) -> int:
        return len(self._steps)

    def send_next(self, limit: int) -> bool:
        """Plans the next step and sends it, unless `limit` steps are in flight or it would be empty; whether it
        sent one."""
        if len(self._steps) >= limit:
            return False
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return False
        self._steps.append(SentStep(plan, self._send(plan)))
        return True

    @property
    def oldest(self) -> SentStep[Sent]:
        return self._steps[0]

    def apply_oldest(self, outcome: StepOutcome) -> list[RequestUpdate]:
        """The oldest step's outcome applied to the scheduler; the requests' updates."""
        plan, _ = self._steps.popleft()
        return self.scheduler.update_from_outcome(plan, outcome)
