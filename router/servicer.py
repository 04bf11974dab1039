"""sluice.v1.Generation's servicer: validates, tokenizes and streams each generation through the scheduler pool."""
import asyncio
import uuid

from sluice.core.errors import InvalidArgument
from sluice.core.finish_reason import FinishReason
from sluice.core.images import ImageInput
from sluice.core.sampling_params_pb import sampling_params_from_pb
from sluice.router.chat_pb import chat_from_pb
from sluice.router.chat_prompts import ChatPrompts
from sluice.router.generation_flow import deadline_unix_seconds, stream_generation
from sluice.router.generation_output import generation_output
from sluice.router.request_checks import RequestChecks
from sluice.router.schedulers.messages import Submission
from sluice.router.schedulers.pool import SchedulerPool
from sluice.router.telemetry.requests import RouterTelemetry
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, schedulers: SchedulerPool, prompts: ChatPrompts, model_info: pb.ModelInfo,
                 telemetry: RouterTelemetry):
        self.schedulers = schedulers
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.model_info = model_info
        self.telemetry = telemetry
        self.checks = RequestChecks(prompts.tokenizer, model_info.max_model_len)

    async def Generate(self, request: pb.GenerateRequest, context):
        prompt_ids, images = await asyncio.to_thread(self._prompt, request)
        params = self.checks.sampling(sampling_params_from_pb(request.sampling, self.checks.defaults(len(prompt_ids))),
                                      len(prompt_ids))
        request_id = request.request_id or uuid.uuid4().hex
        telemetry = self.telemetry.begin(request.WhichOneof("input"), request_id, len(prompt_ids), params)
        submission = Submission(request_id, prompt_ids, params, request.priority, request.cache_salt,
                                deadline_unix_seconds(context), telemetry.trace_context, images)
        output = generation_output(request_id, params, self.tokenizer, request.return_token_ids, telemetry.timings)
        async for response in stream_generation(self.schedulers, submission, output, telemetry, context):
            yield response

    def _prompt(self, request: pb.GenerateRequest) -> tuple[list[int], list[ImageInput]]:
        """Runs in a worker thread: templating a long prompt and processing its images must not hold up the other
        streams."""
        kind = request.WhichOneof("input")
        images = []
        if kind == "text":
            token_ids = self.tokenizer.encode_text(request.text) if request.text else []
        elif kind == "chat":
            token_ids, images = self.prompts.encode(chat_from_pb(request.chat)) if request.chat.messages else ([], [])
        elif kind == "tokens":
            token_ids = list(request.tokens.ids)
        else:
            raise InvalidArgument("input", "set one of text, tokens or chat")
        self.prompts.check_placeholders(token_ids, images, kind)
        sampling = request.sampling
        token_ids = self.checks.prompt(token_ids, sampling.truncate_prompt_tokens
                                       if sampling.HasField("truncate_prompt_tokens") else None, kind, bool(images))
        return token_ids, images

    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        return pb.AbortResponse(found=self.schedulers.finish(request.request_id, FinishReason.ABORT))

    async def GetModelInfo(self, request, context) -> pb.ModelInfo:
        return self.model_info

    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        if request.WhichOneof("input") == "chat":
            token_ids, _ = await asyncio.to_thread(self.prompts.encode, chat_from_pb(request.chat))
        else:
            token_ids = await asyncio.to_thread(self.tokenizer.encode_text, request.text)
        return pb.TokenizeResponse(token_ids=token_ids)
