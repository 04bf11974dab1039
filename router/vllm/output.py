"""vLLM's engine protocol's view of one generation: token ids only (the gateway detokenizes), per sample. Streamed:
a chunk of new token ids at a time and one GenerateComplete per sample with its finish reason, counts and matched
stop; unstreamed: one GenerateComplete per sample with all its token ids and logprobs."""
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from sluice.core.finish_reason import FinishReason
from sluice.core.logprobs import Logprobs
from sluice.core.sampling_params import SamplingParams
from sluice.router.generation_flow import GenerationOutput
from sluice.router.sample_stops import SampleStops
from sluice.router.schedulers.messages import Finished, Tokens, joined_logprobs
from sluice.router.vllm.kv_transfer_json import kv_transfer_to_json


def vllm_generation_output(params: SamplingParams, tokenizer, prompt_token_ids: list[int],
                           stream: bool) -> GenerationOutput:
    samples = [VllmSampleOutput(i, tokenizer, params, prompt_token_ids, stream) for i in range(params.n)]
    return GenerationOutput(samples, _response)


class VllmSampleOutput:
    def __init__(self, index: int, tokenizer, params: SamplingParams, prompt_token_ids: list[int], stream: bool):
        self.index = index
        self.stops = SampleStops(tokenizer, params, with_text=False)
        self._stop_token_ids = set(params.stop_token_ids)
        self._prompt_token_ids = prompt_token_ids
        self._stream = stream
        self._token_ids: list[int] = []  # unstreamed: every token so far
        self._last_token_id: int | None = None
        self._logprobs: Logprobs | None = None  # unstreamed: of every token so far
        self._prompt_logprobs: Logprobs | None = None  # until sent
        self._prompt_logprobs_sent = False

    def chunk(self, delta: Tokens) -> list[vllm.GenerateStreamChunk]:
        _, token_ids = self.stops.take(delta.token_ids)
        if delta.prompt_logprobs is not None:
            self._prompt_logprobs = joined_logprobs(self._prompt_logprobs, delta.prompt_logprobs)
        logprobs = delta.logprobs.slice(0, len(token_ids)) if delta.logprobs is not None else None
        if token_ids:
            self._last_token_id = token_ids[-1]
        if not self._stream:
            self._token_ids += token_ids
            self._logprobs = joined_logprobs(self._logprobs, logprobs)
            return []
        if not token_ids:
            return []
        chunk = vllm.GenerateStreamChunk(token_ids=token_ids, prompt_tokens=len(self._prompt_token_ids),
                                         completion_tokens=len(token_ids), index=self.index)
        if logprobs is not None:
            chunk.output_logprobs.CopyFrom(_output_logprobs(logprobs))
        self._attach_prompt_logprobs(chunk)
        return [chunk]

    def complete(self, finished: Finished) -> list[vllm.GenerateComplete]:
        _, reason, num_tokens = self.stops.end(finished)
        complete = vllm.GenerateComplete(
            output_ids=[] if self._stream else self._token_ids, finish_reason=reason.reported,
            prompt_tokens=finished.usage.prompt_tokens, completion_tokens=num_tokens,
            cached_tokens=finished.usage.cached_tokens, index=self.index)
        if self.stops.matched is not None:
            complete.matched_stop_str = self.stops.matched
        elif reason is FinishReason.STOP and self._last_token_id in self._stop_token_ids:
            complete.matched_token_id = self._last_token_id
        if self._logprobs is not None:
            complete.output_logprobs.CopyFrom(_output_logprobs(self._logprobs))
        if finished.kv_transfer is not None:
            complete.kv_transfer_params_json = kv_transfer_to_json(finished.kv_transfer)
        self._attach_prompt_logprobs(complete)
        return [complete]

    def _attach_prompt_logprobs(self, message: vllm.GenerateStreamChunk | vllm.GenerateComplete) -> None:
        """Once per sample, with its first tokens (or its completion)."""
        if self._prompt_logprobs is not None and not self._prompt_logprobs_sent:
            message.input_logprobs.CopyFrom(_input_logprobs(self._prompt_token_ids[0], self._prompt_logprobs))
            self._prompt_logprobs_sent = True


def _output_logprobs(logprobs: Logprobs) -> vllm.OutputLogProbs:
    return vllm.OutputLogProbs(token_logprobs=logprobs.logprobs, token_ids=logprobs.token_ids,
                               top_logprobs=_top_logprobs(logprobs))


def _input_logprobs(first_token_id: int, logprobs: Logprobs) -> vllm.InputLogProbs:
    """The first prompt token has no logprob: it leads, empty."""
    return vllm.InputLogProbs(
        token_logprobs=[vllm.InputTokenLogProb(), *(vllm.InputTokenLogProb(value=v) for v in logprobs.logprobs)],
        token_ids=[first_token_id, *logprobs.token_ids],
        top_logprobs=[vllm.TopLogProbs(), *_top_logprobs(logprobs)])


def _top_logprobs(logprobs: Logprobs) -> list[vllm.TopLogProbs]:
    k = logprobs.num_top
    return [vllm.TopLogProbs(values=logprobs.top_logprobs[i * k:(i + 1) * k],
                             token_ids=logprobs.top_token_ids[i * k:(i + 1) * k]) for i in range(len(logprobs))]


def _response(message: vllm.GenerateStreamChunk | vllm.GenerateComplete) -> vllm.GenerateResponse:
    if isinstance(message, vllm.GenerateStreamChunk):
        return vllm.GenerateResponse(chunk=message)
    return vllm.GenerateResponse(complete=message)
