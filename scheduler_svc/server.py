import asyncio
import contextlib
import logging

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.engine_loop import EngineLoop
from scheduler_svc.router_sessions import RouterSessions
from scheduler_svc.scheduler import Scheduler
from scheduler_svc.servicer import SchedulerServicer
from scheduler_svc.worker_client import WorkerClient
from sluice.serving import Service
from sluice.v1 import generation_pb2, scheduler_pb2_grpc

SERVICE_NAME = "sluice.v1.Scheduler"
log = logging.getLogger("sluice.scheduler")


async def serve(worker_address: str, address: str, num_blocks: int = 0, worker_timeout: float = 600.0,
                shutdown_grace: float = 5.0, **scheduler_options) -> None:
    """num_blocks 0 asks the worker to size the KV cache from its memory budget; scheduler_options are the
    remaining SchedulerConfig fields."""
    service = Service([SERVICE_NAME])
    worker = WorkerClient(worker_address)
    info = await worker.get_info(timeout=worker_timeout)
    block_size = scheduler_options.get("block_size", 16)
    num_blocks = await worker.init_cache(block_size, num_blocks)
    max_model_len = min(scheduler_options.pop("max_model_len", info.max_model_len), info.max_model_len)
    config = SchedulerConfig(num_blocks=num_blocks, max_model_len=max_model_len, **scheduler_options)
    worker.open_stream()
    sessions = RouterSessions()
    loop = EngineLoop(Scheduler(config, set(info.eos_token_ids)), worker, sessions)
    model_info = generation_pb2.ModelInfo(model=info.model, architecture=info.architecture,
                                          max_model_len=config.max_model_len, vocab_size=info.vocab_size,
                                          dtype=info.dtype, num_kv_blocks=num_blocks, block_size=config.block_size)
    service.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server, SchedulerServicer(loop, sessions, model_info))
    port = await service.start(address)
    engine = asyncio.create_task(loop.run())
    await service.set_ready(True)
    log.info("scheduler on port %d: %d KV blocks of %d tokens", port, num_blocks, config.block_size)
    try:
        await asyncio.wait([engine, asyncio.create_task(service.wait())], return_when=asyncio.FIRST_COMPLETED)
        if engine.done():
            engine.result()
    finally:
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine
        await service.stop(shutdown_grace)
        await worker.close()
