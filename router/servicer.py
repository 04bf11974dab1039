import asyncio
import time
import uuid

from router.generation_output import GenerationOutput
from router.request_telemetry import RouterTelemetry
from router.scheduler_messages import Failed, Submission, Tokens
from router.scheduler_pool import SchedulerPool
from router.tokenizer import RouterTokenizer
from router.validation import (check_bad_words_token_ids, truncate_prompt, validate_chat_roles, validate_prompt,
                               validate_sampling)
from sluice.core.errors import InvalidArgument, SluiceError
from sluice.core.finish_reason import FinishReason
from sluice.core.sampling_params import SamplingParams
from sluice.core.sampling_params_pb import sampling_params_from_pb
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, schedulers: SchedulerPool, tokenizer: RouterTokenizer, model_info: pb.ModelInfo,
                 telemetry: RouterTelemetry):
        self.schedulers = schedulers
        self.tokenizer = tokenizer
        self.model_info = model_info
        self.telemetry = telemetry

    async def Generate(self, request: pb.GenerateRequest, context):
        prompt_ids = await asyncio.to_thread(self._prompt_token_ids, request)
        params = self._sampling_params(request.sampling, len(prompt_ids))
        request_id = request.request_id or uuid.uuid4().hex
        remaining = context.time_remaining()
        telemetry = self.telemetry.begin(request.WhichOneof("input"), request_id, len(prompt_ids), params)
        submission = Submission(request_id, prompt_ids, params, request.priority, request.cache_salt,
                                time.time() + remaining if remaining is not None else 0.0, telemetry.trace_context)
        output = GenerationOutput(request_id, params, self.tokenizer, request.return_token_ids, telemetry.timings)
        try:
            events = self.schedulers.submit(submission)
        except SluiceError as error:
            telemetry.refused(error)
            raise
        try:
            while not output.done:
                batch = _drain(await events.get(), events)
                num_tokens = sum(len(event.token_ids) for event in batch if isinstance(event, Tokens))
                if num_tokens:
                    telemetry.tokens(num_tokens)
                for ending in (event for event in batch if not isinstance(event, Tokens)):
                    telemetry.ended(ending)
                    await _abort_on_failure(ending, context)
                for response in output.responses(batch):
                    yield response
                for index in output.take_new_stops():
                    self.schedulers.finish(request_id, FinishReason.STOP, index)
        finally:
            if not output.done:
                self.schedulers.finish(request_id, FinishReason.ABORT)
            self.schedulers.release(request_id)
            telemetry.close()

    def _prompt_token_ids(self, request: pb.GenerateRequest) -> list[int]:
        """Runs in a worker thread: tokenizing and templating a long prompt must not hold up the other streams."""
        kind = request.WhichOneof("input")
        if kind == "text":
            token_ids = self.tokenizer.encode_text(request.text) if request.text else []
        elif kind == "chat":
            token_ids = self.tokenizer.encode_chat(_chat_messages(request.chat)) if request.chat.messages else []
        elif kind == "tokens":
            token_ids = list(request.tokens.ids)
        else:
            raise InvalidArgument("input", "set one of text, tokens or chat")
        sampling = request.sampling
        token_ids = truncate_prompt(token_ids, sampling.truncate_prompt_tokens
                                    if sampling.HasField("truncate_prompt_tokens") else None)
        validate_prompt(token_ids, self.tokenizer.vocab_size, self.model_info.max_model_len, kind)
        return token_ids

    def _sampling_params(self, message: pb.SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        default_max_tokens = self.model_info.max_model_len - num_prompt_tokens
        params = sampling_params_from_pb(message, SamplingParams(max_tokens=default_max_tokens))
        validate_sampling(params, num_prompt_tokens, self.model_info.max_model_len, self.tokenizer.vocab_size)
        self.tokenizer.check_text_controls(params)
        if params.bad_words:
            words = self.tokenizer.bad_words_token_ids(params.bad_words)
            check_bad_words_token_ids("sampling.bad_words", words, self.tokenizer.vocab_size)
            params.bad_words_token_ids = params.bad_words_token_ids + words
        return params

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        return pb.AbortResponse(found=self.schedulers.finish(request.request_id, FinishReason.ABORT))

    async def GetModelInfo(self, request, context) -> pb.ModelInfo:
        return self.model_info

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        if request.WhichOneof("input") == "chat":
            token_ids = await asyncio.to_thread(self.tokenizer.encode_chat, _chat_messages(request.chat))
        else:
            token_ids = await asyncio.to_thread(self.tokenizer.encode_text, request.text)
        return pb.TokenizeResponse(token_ids=token_ids)


def _chat_messages(chat: pb.ChatMessages) -> list[dict[str, str]]:
    validate_chat_roles([message.role for message in chat.messages])
    return [{"role": message.role, "content": message.content} for message in chat.messages]


def _drain(event, events) -> list:
    """The event and every one already queued, so a slow client gets one chunk per sample instead of a backlog of
    small ones."""
    batch = [event]
    while not events.empty():
        batch.append(events.get_nowait())
    return batch


async def _abort_on_failure(ending, context) -> None:
    if isinstance(ending, Failed):
        await context.abort(ending.status, ending.details)
