"""How many steps the engine loop keeps in flight, from the measured step and turnaround times."""
from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT

SHORT_STEP_SECONDS = 0.003  # below this the wire's and the worker's share of a turnaround, unseen here, matters
HOST_SHARE_OF_STEP = 0.25  # a scheduler turnaround above this share of a step keeps the deeper pipeline
_SMOOTHING = 0.2


class PipelineDepth:
    """How many steps the engine loop keeps in flight. A step queued on the worker behind the running one hides the
    host's turnaround (an outcome applied and published, the next step planned, sent and launched); each further one
    delays a newcomer's first token by a step. So two are in flight (the running step and the next one) while steps
    are long and the scheduler's turnaround a small share of them, MAX_STEPS_IN_FLIGHT otherwise; and never fewer
    than the worker's pipeline stages, each of which runs one of them."""

    def __init__(self, num_stages: int = 1):
        self.num_stages = num_stages
        self.step_seconds = 0.0  # between outcomes, smoothed: the device's step time while it has work
        self.turnaround_seconds = 0.0  # from an outcome's arrival to the next plan sent, smoothed
        self._last_outcome_at: float | None = None
        self._awaiting_plan = False  # an outcome arrived and no plan has been sent since

    @property
    def limit(self) -> int:
        long_steps = self.step_seconds >= SHORT_STEP_SECONDS
        if long_steps and self.turnaround_seconds <= HOST_SHARE_OF_STEP * self.step_seconds:
            return max(2, self.num_stages)
        return max(MAX_STEPS_IN_FLIGHT, self.num_stages)

    def outcome_received(self, now: float) -> None:
        if self._last_outcome_at is not None:
            self.step_seconds = _smoothed(self.step_seconds, now - self._last_outcome_at)
        self._last_outcome_at = now
        self._awaiting_plan = True

    def plan_sent(self, now: float) -> None:
        if self._awaiting_plan:
            self.turnaround_seconds = _smoothed(self.turnaround_seconds, now - self._last_outcome_at)
            self._awaiting_plan = False

    def idled(self) -> None:
        """The time spent without work is no step's."""
        self._last_outcome_at = None
        self._awaiting_plan = False


def _smoothed(average: float, sample: float) -> float:
    return average + _SMOOTHING * (sample - average) if average else sample
