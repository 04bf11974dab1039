"""What every public API does with one generation once it is checked: submit it to a scheduler, turn the events into
the protocol's responses per sample, end the samples whose stop string matched, and abort what the client left."""
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc

from sluice.core.errors import SluiceError
from sluice.core.finish_reason import FinishReason
from sluice.router.sample_stops import SampleStops
from sluice.router.schedulers.messages import Failed, Finished, Submission, Tokens
from sluice.router.schedulers.pool import SchedulerPool
from sluice.router.telemetry.requests import RequestTelemetry

log = logging.getLogger("sluice.router")


class Sample(Protocol):
    stops: SampleStops

    def chunk(self, delta: Tokens) -> list: ...

    def complete(self, finished: Finished) -> list: ...


class GenerationOutput:
    """The client's view of one generation: per sample, chunks of what is new and one completion; done once every
    sample has completed. The samples say it in one protocol's messages."""

    def __init__(self, samples: list[Sample], wrap: Callable[[object], object]):
        """wrap: a sample's message as the stream's response message."""
        self.samples = samples
        self.num_complete = 0
        self._wrap = wrap
        self._new_stops: list[int] = []

    @property
    def done(self) -> bool:
        return self.num_complete == len(self.samples)

    def responses(self, events: list) -> list:
        """What is new per sample (the events' tokens merged), then the completion of each finished sample."""
        out = []
        for index, delta in _merge_tokens(events).items():
            sample = self.samples[index]
            had_stopped = sample.stops.matched is not None
            out += sample.chunk(delta)
            if sample.stops.matched is not None and not had_stopped:
                self._new_stops.append(index)
        for event in events:
            if isinstance(event, Finished):
                out += self.samples[event.index].complete(event)
                self.num_complete += 1
        return [self._wrap(message) for message in out]

    def take_new_stops(self) -> list[int]:
        """Samples whose stop string matched since the last call: the scheduler must end them."""
        stops, self._new_stops = self._new_stops, []
        return stops


def _merge_tokens(events: list) -> dict[int, Tokens]:
    merged: dict[int, Tokens] = {}
    for event in events:
        if isinstance(event, Tokens):
            merged.setdefault(event.index, Tokens(event.index)).extend(event.token_ids, event.logprobs,
                                                                      event.prompt_logprobs)
    return merged




def deadline_unix_seconds(context) -> float:
    """The call's deadline as the scheduler takes it: 0 for none."""
    remaining = context.time_remaining()
    return time.time() + remaining if remaining is not None else 0.0


async def stream_generation(schedulers: SchedulerPool, submission: Submission, output: GenerationOutput,
                            telemetry: RequestTelemetry, context) -> AsyncIterator:
    """A request that its replica fails with UNAVAILABLE (it lost its worker, or the router its link) before it sent
    any output is submitted once more, to another ready replica."""
    try:
        events = schedulers.submit(submission)
    except SluiceError as error:
        telemetry.refused(error)
        raise
    request_id = submission.request_id
    may_resubmit = True
    try:
        while not output.done:
            batch = _drain(await events.get(), events)
            tokens = [event for event in batch if isinstance(event, Tokens)]
            num_tokens = sum(len(event.token_ids) for event in tokens)
            if num_tokens:
                telemetry.tokens(num_tokens)
            failed = next((event for event in batch if isinstance(event, Failed)), None)
            if may_resubmit and not tokens and failed is not None and failed.status == grpc.StatusCode.UNAVAILABLE:
                may_resubmit = True
                events = _submit_elsewhere(schedulers, submission, failed)
                if events is not None:
                    continue
            may_resubmit = may_resubmit and not tokens
            for ending in (event for event in batch if not isinstance(event, Tokens)):
                telemetry.ended(ending)
                if isinstance(ending, Failed):
                    await context.abort(ending.status, ending.details)
            for response in output.responses(batch):
                yield response
            for index in output.take_new_stops():
                schedulers.finish(request_id, FinishReason.STOP, index)
    finally:
        if not output.done:
            schedulers.finish(request_id, FinishReason.ABORT)
        schedulers.release(request_id)
        telemetry.close()


def _submit_elsewhere(schedulers: SchedulerPool, submission: Submission, failed: Failed):
    """The request's events from another replica; None if none is ready."""
    try:
        return schedulers.submit_elsewhere(submission)
    except SluiceError as error:
        log.warning("request %s failed (%s) and no other scheduler is ready: %s", submission.request_id,
                    failed.details, error)
        return None


def _drain(event, events) -> list:
    """The event and every one already queued, so a slow client gets one chunk per sample instead of a backlog of
    small ones."""
    batch = [event]
    while not events.empty():
        batch.append(events.get_nowait())
    return batch
