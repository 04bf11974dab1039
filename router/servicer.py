"""sluice.v1.Generation's servicer: validates, tokenizes and streams each generation through the scheduler pool."""
import asyncio
import uuid

from sluice.core.errors import InvalidArgument
from sluice.core.finish_reason import FinishReason
from sluice.core.sampling_params_pb import sampling_params_from_pb
from sluice.router.generation_flow import deadline_unix_seconds, stream_generation
from sluice.router.generation_output import generation_output
from sluice.router.request_checks import RequestChecks
from sluice.router.schedulers.messages import Submission
from sluice.router.schedulers.pool import SchedulerPool
from sluice.router.telemetry.requests import RouterTelemetry
from sluice.router.tokenizer import RouterTokenizer
from sluice.router.validation import validate_chat_roles
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, schedulers: SchedulerPool, tokenizer: RouterTokenizer, model_info: pb.ModelInfo,
                 telemetry: RouterTelemetry):
        self.schedulers = schedulers
        self.tokenizer = tokenizer
        self.model_info = model_info
        self.telemetry = telemetry
        self.checks = RequestChecks(tokenizer, model_info.max_model_len)

    async def Generate(self, request: pb.GenerateRequest, context):
        prompt_ids = await asyncio.to_thread(self._prompt_token_ids, request)
        params = self.checks.sampling(sampling_params_from_pb(request.sampling, self.checks.defaults(len(prompt_ids))),
                                      len(prompt_ids))
        request_id = request.request_id or uuid.uuid4().hex
        telemetry = self.telemetry.begin(request.WhichOneof("input"), request_id, len(prompt_ids), params)
        submission = Submission(request_id, prompt_ids, params, request.priority, request.cache_salt,
                                deadline_unix_seconds(context), telemetry.trace_context)
        output = generation_output(request_id, params, self.tokenizer, request.return_token_ids, telemetry.timings)
        async for response in stream_generation(self.schedulers, submission, output, telemetry, context):
            yield response

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
        return self.checks.prompt(token_ids, sampling.truncate_prompt_tokens
                                  if sampling.HasField("truncate_prompt_tokens") else None, kind)

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
