"""The time a stretch of queued work takes on the device, read once the work has finished: between two CUDA events
on a GPU (nothing waits for the device), by the host's clock on a CPU (where work runs as it is queued)."""
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class TimedSpan:
    start: torch.cuda.Event | float | None = None
    end: torch.cuda.Event | float | None = None

    def seconds(self) -> float:
        """Only after the device has finished the span's work."""
        if isinstance(self.start, float):
            return self.end - self.start
        return self.start.elapsed_time(self.end) / 1000


@contextmanager
def timed_span(device: torch.device) -> Iterator[TimedSpan]:
    span = TimedSpan()
    span.start = _mark(device)
    yield span
    span.end = _mark(device)


def _mark(device: torch.device) -> torch.cuda.Event | float:
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event
