"""sluice.v1's view of one generation: per sample, text deltas cut at stop strings, logprobs with their tokens' text,
and one Complete message."""
from collections.abc import Callable

from sluice.core.finish_reason_pb import finish_reason_to_pb
from sluice.core.logprobs import Logprobs
from sluice.core.logprobs_pb import logprobs_to_pb
from sluice.core.sampling_params import SamplingParams
from sluice.router.generation_flow import GenerationOutput
from sluice.router.sample_stops import SampleStops
from sluice.router.schedulers.messages import Finished, Tokens
from sluice.router.telemetry.requests import Timings
from sluice.v1 import generation_pb2 as pb


def generation_output(request_id: str, params: SamplingParams, tokenizer, return_token_ids: bool,
                      timings: Callable[[], Timings]) -> GenerationOutput:
    """sluice.v1's stream; timings: the request's latencies so far, for each Complete message."""
    samples = [SampleOutput(i, tokenizer, params, return_token_ids, timings) for i in range(params.n)]
    return GenerationOutput(samples, lambda message: pb.GenerateResponse(request_id=request_id,
                                                                         **{_kind(message): message}))


class SampleOutput:
    """Text deltas cut at stop strings, logprobs with their tokens' text, and one Complete message."""

    def __init__(self, index: int, tokenizer, params: SamplingParams, return_token_ids: bool,
                 timings: Callable[[], Timings]):
        self.index = index
        self.stops = SampleStops(tokenizer, params, with_text=True)
        self._tokenizer = tokenizer
        self._return_token_ids = return_token_ids
        self._timings = timings

    def chunk(self, delta: Tokens) -> list[pb.Chunk]:
        """The chunk for new tokens or prompt logprobs; nothing for tokens that follow a stop string."""
        if self.stops.matched is not None:
            return []
        text, token_ids = self.stops.take(delta.token_ids)
        if not token_ids and delta.prompt_logprobs is None:
            return []
        chunk = pb.Chunk(text=text, token_ids=token_ids if self._return_token_ids else [], index=self.index)
        if delta.logprobs is not None:
            chunk.logprobs.CopyFrom(self._named(delta.logprobs.slice(0, len(token_ids))))
        if delta.prompt_logprobs is not None:
            chunk.prompt_logprobs.CopyFrom(self._named(delta.prompt_logprobs))
        return [chunk]

    def complete(self, finished: Finished) -> list[pb.Chunk | pb.Complete]:
        """The text held back for a stop string that never came, if any, then the Complete message."""
        tail, reason, num_tokens = self.stops.end(finished)
        timings = self._timings()
        usage = pb.Usage(prompt_tokens=finished.usage.prompt_tokens, completion_tokens=num_tokens,
                         cached_tokens=finished.usage.cached_tokens)
        complete = pb.Complete(finish_reason=finish_reason_to_pb(reason), usage=usage, index=self.index,
                               timings=pb.Timings(time_to_first_token_seconds=timings.time_to_first_token_seconds,
                                                  total_seconds=timings.total_seconds))
        return [pb.Chunk(text=tail, index=self.index), complete] if tail else [complete]

    def _named(self, logprobs: Logprobs) -> pb.Logprobs:
        message = logprobs_to_pb(logprobs)
        message.tokens.extend(self._tokenizer.token_texts(logprobs.token_ids))
        message.top_tokens.extend(self._tokenizer.token_texts(logprobs.top_token_ids))
        return message


def _kind(message) -> str:
    return "chunk" if isinstance(message, pb.Chunk) else "complete"
