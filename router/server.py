import asyncio
import logging
from pathlib import Path

from router.scheduler_link import SchedulerLink
from router.servicer import GenerationServicer
from router.tokenizer import RouterTokenizer
from sluice.serving import Service
from sluice.v1 import generation_pb2_grpc

SERVICE_NAME = "sluice.v1.Generation"
log = logging.getLogger("sluice.router")


async def serve(model_path: Path, scheduler_address: str, address: str, scheduler_timeout: float = 600.0,
                shutdown_grace: float = 5.0) -> None:
    service = Service([SERVICE_NAME])
    tokenizer = await asyncio.to_thread(RouterTokenizer, model_path)
    link = SchedulerLink(scheduler_address)
    model_info = await link.model_info(timeout=scheduler_timeout)
    link.start()
    service.add(generation_pb2_grpc.add_GenerationServicer_to_server, GenerationServicer(link, tokenizer, model_info))
    port = await service.start(address)
    await service.set_ready(True)
    log.info("router on port %d, serving %s", port, model_info.model)
    try:
        await service.wait()
    finally:
        await service.stop(shutdown_grace)
        await link.close()
