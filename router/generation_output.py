"""The client's view of one generation: per sample, text deltas cut at stop strings, logprobs with their tokens'
text, and one Complete message; the stream is done once every sample has completed."""
from collections.abc import Callable

from router.request_telemetry import Timings
from router.scheduler_messages import Finished, Tokens
from router.stop_strings import StopStringMatcher
from sluice.core.finish_reason import FinishReason
from sluice.core.finish_reason_pb import finish_reason_to_pb
from sluice.core.logprobs import Logprobs
from sluice.core.logprobs_pb import logprobs_to_pb
from sluice.core.sampling_params import SamplingParams
from sluice.v1 import generation_pb2 as pb


class SampleOutput:
    def __init__(self, index: int, tokenizer, params: SamplingParams, return_token_ids: bool):
        self.index = index
        self._tokenizer = tokenizer
        self._detokenizer = tokenizer.detokenizer()
        self._stop = StopStringMatcher(params.stop, params.include_stop_str_in_output) if params.stop else None
        self._return_token_ids = return_token_ids
        self.num_tokens = 0  # streamed so far; after a stop string, up to the token that completed it

    @property
    def matched_stop(self) -> bool:
        return self._stop is not None and self._stop.matched is not None

    def chunk(self, delta: Tokens) -> pb.Chunk | None:
        """The chunk for new tokens or prompt logprobs; nothing for tokens that follow a stop string."""
        if self.matched_stop:
            return None
        text, token_ids = self._text(delta.token_ids)
        if not token_ids and delta.prompt_logprobs is None:
            return None
        self.num_tokens += len(token_ids)
        chunk = pb.Chunk(text=text, token_ids=token_ids if self._return_token_ids else [], index=self.index)
        if delta.logprobs is not None:
            chunk.logprobs.CopyFrom(self._named(delta.logprobs.slice(0, len(token_ids))))
        if delta.prompt_logprobs is not None:
            chunk.prompt_logprobs.CopyFrom(self._named(delta.prompt_logprobs))
        return chunk

    def complete(self, finished: Finished, timings: Timings) -> list[pb.Chunk | pb.Complete]:
        """The text held back for a stop string that never came, if any, then the Complete message."""
        tail = self._stop.flush() if self._stop is not None else ""
        reason, num_tokens = finished.reason, finished.usage.completion_tokens
        if self.matched_stop:
            reason, num_tokens = FinishReason.STOP, self.num_tokens
        usage = pb.Usage(prompt_tokens=finished.usage.prompt_tokens, completion_tokens=num_tokens,
                         cached_tokens=finished.usage.cached_tokens)
        complete = pb.Complete(finish_reason=finish_reason_to_pb(reason), usage=usage, index=self.index,
                               timings=pb.Timings(time_to_first_token_seconds=timings.time_to_first_token_seconds,
                                                  total_seconds=timings.total_seconds))
        return [pb.Chunk(text=tail, index=self.index), complete] if tail else [complete]

    def _text(self, token_ids: list[int]) -> tuple[str, list[int]]:
        """The text of the tokens, and the tokens, up to the one that completes a stop string."""
        if self._stop is None:
            return self._detokenizer.push(token_ids), token_ids
        parts = []
        for num_taken, token_id in enumerate(token_ids, 1):
            parts.append(self._stop.push(self._detokenizer.push([token_id])))
            if self._stop.matched is not None:
                return "".join(parts), token_ids[:num_taken]
        return "".join(parts), token_ids

    def _named(self, logprobs: Logprobs) -> pb.Logprobs:
        message = logprobs_to_pb(logprobs)
        message.tokens.extend(self._tokenizer.token_texts(logprobs.token_ids))
        message.top_tokens.extend(self._tokenizer.token_texts(logprobs.top_token_ids))
        return message


class GenerationOutput:
    def __init__(self, request_id: str, params: SamplingParams, tokenizer, return_token_ids: bool,
                 timings: Callable[[], Timings]):
        """timings: the request's latencies so far, for each Complete message."""
        self.request_id = request_id
        self.samples = [SampleOutput(i, tokenizer, params, return_token_ids) for i in range(params.n)]
        self.num_complete = 0
        self._timings = timings
        self._new_stops: list[int] = []

    @property
    def done(self) -> bool:
        return self.num_complete == len(self.samples)

    def responses(self, events: list) -> list[pb.GenerateResponse]:
        """One chunk per sample with news (the events' tokens merged), then a Complete per finished sample."""
        out = []
        for index, delta in _merge_tokens(events).items():
            sample = self.samples[index]
            had_stopped = sample.matched_stop
            chunk = sample.chunk(delta)
            if chunk is not None:
                out.append(chunk)
            if sample.matched_stop and not had_stopped:
                self._new_stops.append(index)
        for event in events:
            if isinstance(event, Finished):
                out += self.samples[event.index].complete(event, self._timings())
                self.num_complete += 1
        return [pb.GenerateResponse(request_id=self.request_id, **{_kind(m): m}) for m in out]

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


def _kind(message) -> str:
    return "chunk" if isinstance(message, pb.Chunk) else "complete"
