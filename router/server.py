"""The router process: serves sluice.v1.Generation and vLLM's engine protocol over its scheduler replicas."""
import asyncio
import logging
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from sluice.core.options import as_flags
from sluice.router.chat_prompts import ChatPrompts
from sluice.router.config import RouterConfig
from sluice.router.multimodal.vision_prompts import VisionPrompts, model_takes_images
from sluice.router.schedulers.disaggregated_pool import DisaggregatedPool
from sluice.router.schedulers.pool import SchedulerPool
from sluice.router.servicer import GenerationServicer
from sluice.router.telemetry.metrics import RouterMetrics
from sluice.router.telemetry.requests import RouterTelemetry
from sluice.router.tokenizer import RouterTokenizer, TokenIdsOnly
from sluice.router.vllm.servicer import VllmEngineServicer
from sluice.serving.operations import Operations
from sluice.serving.readiness import wait_until_serving
from sluice.serving.service import Service
from sluice.v1 import generation_pb2, generation_pb2_grpc, scheduler_pb2

SERVICE_NAME = generation_pb2.DESCRIPTOR.services_by_name["Generation"].full_name
VLLM_SERVICE_NAME = vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name
SCHEDULER_SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
log = logging.getLogger("sluice.router")


async def serve(tokenizer_path: Path | None, scheduler_addresses: list[str], addresses: list[str],
                operations: Operations, interceptors=(), credentials: grpc.ServerCredentials | None = None,
                scheduler_timeout: float = 600.0, config: RouterConfig | None = None, share_port: bool = False,
                prefill_scheduler_addresses: list[str] = ()) -> None:
    """tokenizer_path None: no tokenizer, requests carry token ids and responses only token ids. Not ready until
    every scheduler is, then ready while any is connected; on shutdown, new calls get UNAVAILABLE while the streams
    in flight finish. A client message over config.max_receive_bytes gets RESOURCE_EXHAUSTED. Serves
    sluice.v1.Generation and, for gateways such as smg, vLLM's engine protocol, on every address; with share_port,
    router processes that listen on the same port take a share of its connections each. With
    prefill_scheduler_addresses, each request prefills on one of those replicas and decodes on one of
    scheduler_addresses (prefill/decode disaggregation)."""
    config = config or RouterConfig()
    log.info("router settings: %s", " ".join(as_flags(config, RouterConfig)))
    takes_images = model_takes_images(tokenizer_path)
    async with Service([SERVICE_NAME, VLLM_SERVICE_NAME], "sluice-router", operations, interceptors, credentials,
                       config.max_receive_bytes(takes_images), share_port) as service:
        port = await service.start(*addresses)
        pool = SchedulerPool(scheduler_addresses)
        if prefill_scheduler_addresses:
            pool = DisaggregatedPool(SchedulerPool(prefill_scheduler_addresses), pool)
        try:
            model_info = await service.unless_shutdown(_model_info_once_ready(pool, scheduler_timeout))
            if model_info is None:
                return
            prompts = await asyncio.to_thread(_chat_prompts, tokenizer_path, model_info, config)
            telemetry = RouterTelemetry(service.tracer, RouterMetrics(service.metrics_registry, model_info.model),
                                        model_info.model)
            service.add(generation_pb2_grpc.add_GenerationServicer_to_server,
                        GenerationServicer(pool, prompts, model_info, telemetry))
            service.add(vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server,
                        VllmEngineServicer(pool, prompts, model_info, telemetry, tokenizer_path,
                                           lambda: service.gate.open, operations.shutdown))
            pool.on_ready = service.set_ready
            pool.start()
            log.info("router on port %d, serving %s", port, model_info.model)
            await service.wait_for_shutdown()
            drained = await service.drain()
            log.info("router drained" if drained else "router drain timed out; stopping")
        finally:
            await pool.close()


def _chat_prompts(tokenizer_path: Path | None, model_info: generation_pb2.ModelInfo,
                  config: RouterConfig) -> ChatPrompts:
    if tokenizer_path is None:
        return ChatPrompts(TokenIdsOnly(model_info.vocab_size), None, config, model_info.model)
    tokenizer = RouterTokenizer(tokenizer_path)
    vision = VisionPrompts.of_model(tokenizer_path, tokenizer, config.max_image_pixels)
    return ChatPrompts(tokenizer, vision, config, model_info.model)


async def _model_info_once_ready(pool: SchedulerPool | DisaggregatedPool, timeout: float) -> generation_pb2.ModelInfo:
    await asyncio.gather(*(wait_until_serving(link.channel, SCHEDULER_SERVICE_NAME, timeout) for link in pool.links))
    return await pool.model_info(timeout=timeout)
