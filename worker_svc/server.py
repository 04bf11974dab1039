import asyncio
import logging
from pathlib import Path

from sluice.serving import Service
from sluice.v1 import worker_pb2_grpc
from worker_svc.config import WorkerConfig
from worker_svc.engine import WorkerEngine
from worker_svc.servicer import WorkerServicer

SERVICE_NAME = "sluice.v1.Worker"
log = logging.getLogger("sluice.worker")


async def serve(config: WorkerConfig, address: str, shutdown_grace: float = 5.0) -> None:
    service = Service([SERVICE_NAME])
    engine = await asyncio.to_thread(WorkerEngine, config)
    service.add(worker_pb2_grpc.add_WorkerServicer_to_server, WorkerServicer(engine, Path(config.model).name))
    port = await service.start(address)
    await service.set_ready(True)
    log.info("worker serving %s on port %d", config.model, port)
    try:
        await service.wait()
    finally:
        await service.stop(shutdown_grace)
