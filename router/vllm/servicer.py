"""vLLM's engine protocol (vllm.grpc.engine.VllmEngine, from smg-grpc-proto) on the router, so a gateway that speaks
it (smg) fronts Sluice: token ids in and out, the same checks, admission, deadlines and telemetry as sluice.v1."""
import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import grpc
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from sluice.core.errors import InvalidArgument
from sluice.core.finish_reason import FinishReason
from sluice.core.images import ImageInput
from sluice.router.chat_prompts import ChatPrompts
from sluice.router.generation_flow import deadline_unix_seconds, stream_generation
from sluice.router.request_checks import RequestChecks
from sluice.router.schedulers.kv_event_relay import relay_kv_events
from sluice.router.schedulers.messages import Submission
from sluice.router.schedulers.pool import SchedulerPool
from sluice.router.telemetry.requests import RouterTelemetry
from sluice.router.tokenizer_bundle import tokenizer_bundle
from sluice.router.vllm.info_pb import loads_to_vllm_pb, model_info_to_vllm_pb
from sluice.router.vllm.kv_events_pb import kv_event_batch_to_vllm_pb
from sluice.router.vllm.kv_transfer_json import KV_CONNECTOR, VLLM_KV_ROLES, kv_transfer_from_json
from sluice.router.vllm.multimodal_pb import images_from_vllm_pb
from sluice.router.vllm.output import vllm_generation_output
from sluice.router.vllm.sampling_pb import sampling_params_from_vllm_pb, truncate_prompt_tokens
from sluice.v1 import generation_pb2

_TOKENIZER_CHUNK_BYTES = 64 * 1024
_LOAD_TIMEOUT_SECONDS = 5.0
_UNSUPPORTED_INPUTS = ("media_refs", "kv_transfer_params")


class VllmEngineServicer(vllm_engine_pb2_grpc.VllmEngineServicer):
    def __init__(self, schedulers: SchedulerPool, prompts: ChatPrompts, model_info: generation_pb2.ModelInfo,
                 telemetry: RouterTelemetry, tokenizer_path: Path | None, is_ready: Callable[[], bool],
                 stopping: asyncio.Event):
        self.schedulers = schedulers
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self.model_info = model_info
        self.telemetry = telemetry
        self.tokenizer_path = tokenizer_path
        self.is_ready = is_ready
        self.stopping = stopping  # set when the router begins to drain: the event streams end
        self.checks = RequestChecks(prompts.tokenizer, model_info.max_model_len)
        self._started = time.monotonic()

    async def Generate(self, request: vllm.GenerateRequest, context):
        prompt_ids, images = await asyncio.to_thread(self._prompt, request)
        defaults = self.checks.defaults(len(prompt_ids))
        params = self.checks.sampling(sampling_params_from_vllm_pb(request.sampling_params, defaults),
                                      len(prompt_ids))
        request_id = request.request_id or uuid.uuid4().hex
        telemetry = self.telemetry.begin(request.WhichOneof("input"), request_id, len(prompt_ids), params)
        kv_transfer = kv_transfer_from_json(request.kv_transfer_params_json) \
            if request.HasField("kv_transfer_params_json") else None
        submission = Submission(request_id, prompt_ids, params, deadline_unix_seconds=deadline_unix_seconds(context),
                                trace_context=telemetry.trace_context, images=images, kv_transfer=kv_transfer)
        output = vllm_generation_output(params, self.tokenizer, prompt_ids, request.stream)
        async for response in stream_generation(self.schedulers, submission, output, telemetry, context):
            yield response

    def _prompt(self, request: vllm.GenerateRequest) -> tuple[list[int], list[ImageInput]]:
        """Runs in a worker thread, as tokenizing a long text must not hold up the other streams."""
        unsupported = next((name for name in _UNSUPPORTED_INPUTS if request.HasField(name)), None)
        if unsupported is not None or request.extra_mm_inputs:
            raise InvalidArgument(unsupported or "extra_mm_inputs", "not supported: Sluice takes images "
                                                                    "preprocessed in mm_inputs, and KV transfer "
                                                                    "params as kv_transfer_params_json")
        kind = request.WhichOneof("input")
        if kind == "tokenized":
            token_ids = list(request.tokenized.input_ids)
        elif kind == "text":
            token_ids = self.tokenizer.encode_text(request.text) if request.text else []
        else:
            raise InvalidArgument("input", "set tokenized or text")
        images = self._images(request, token_ids)
        self.prompts.check_placeholders(token_ids, images, kind)
        keep_last = truncate_prompt_tokens(request.sampling_params, self.model_info.max_model_len)
        return self.checks.prompt(token_ids, keep_last, kind, bool(images)), images

    def _images(self, request: vllm.GenerateRequest, token_ids: list[int]) -> list[ImageInput]:
        if not request.HasField("mm_inputs"):
            return []
        if self.prompts.vision is None:
            raise InvalidArgument("mm_inputs", f"the model {self.model_info.model} takes no images")
        return images_from_vllm_pb(request.mm_inputs, self.prompts.vision, self.prompts.config, token_ids)

    async def Abort(self, request: vllm.AbortRequest, context) -> vllm.AbortResponse:
        for request_id in request.request_ids:
            self.schedulers.finish(request_id, FinishReason.ABORT)
        return vllm.AbortResponse()

    async def HealthCheck(self, request, context) -> vllm.HealthCheckResponse:
        """Answered while the router is not ready too (no scheduler connected, draining): healthy is False then."""
        ready = self.is_ready()
        return vllm.HealthCheckResponse(healthy=ready, message="ready" if ready else "not ready")

    async def GetModelInfo(self, request, context) -> vllm.GetModelInfoResponse:
        path = str(self.tokenizer_path) if self.tokenizer_path is not None else ""
        return model_info_to_vllm_pb(self.model_info, self.tokenizer, path, self.prompts.vision is not None)

    async def GetServerInfo(self, request, context) -> vllm.GetServerInfoResponse:
        """mm_item_limits: the images a request may carry, for a gateway to hold requests to before it preprocesses
        them."""
        limits = f"image={self.prompts.config.max_images_per_request}" if self.prompts.vision is not None else ""
        info = self.model_info
        kv_role = VLLM_KV_ROLES.get(info.kv_role, "")
        return vllm.GetServerInfoResponse(active_requests=self.schedulers.num_in_flight,
                                          uptime_seconds=time.monotonic() - self._started, server_type="sluice",
                                          data_parallel_size=1, mm_item_limits=limits,
                                          kv_connector=KV_CONNECTOR if kv_role else "", kv_role=kv_role,
                                          kv_cache_dtype=info.kv_cache_dtype, block_size=info.block_size,
                                          model_dtype=info.dtype)

    async def GetLoads(self, request, context) -> vllm.GetLoadsResponse:
        loads = await self.schedulers.loads(_LOAD_TIMEOUT_SECONDS)
        return loads_to_vllm_pb(loads, self.model_info.block_size)

    async def GetTokenizer(self, request, context):
        bundle = await asyncio.to_thread(tokenizer_bundle, self.tokenizer_path)
        offsets = range(0, len(bundle.data), _TOKENIZER_CHUNK_BYTES)
        for offset in offsets:
            last = offset == offsets[-1]
            yield common_pb2.GetTokenizerChunk(data=bundle.data[offset:offset + _TOKENIZER_CHUNK_BYTES],
                                               sha256=bundle.sha256 if last else "")

    async def SubscribeKvEvents(self, request: common_pb2.SubscribeKvEventsRequest, context):
        """The scheduler's prefix-cache events, each batch with its load, and its load-only batches; its refusal of
        the cursor (OUT_OF_RANGE) comes back as the call's status before any batch, as the subscriber expects, and
        its DATA_LOSS for a reader left behind ends the stream."""
        call = self.schedulers.kv_events(request.start_sequence_number, request.load_records_before_first_batch)
        try:
            await call.initial_metadata()
            if call.done():
                await context.abort(await call.code(), await call.details())
            await context.send_initial_metadata(())
            async for batch in relay_kv_events(call, self.stopping):
                yield kv_event_batch_to_vllm_pb(batch, self.model_info.block_size)
        except grpc.aio.AioRpcError as error:
            await context.abort(error.code(), error.details())
