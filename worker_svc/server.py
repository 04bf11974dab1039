import asyncio
import logging
from pathlib import Path

from sluice.serving.operations import Operations
from sluice.serving.service import Service
from sluice.v1 import worker_pb2, worker_pb2_grpc
from worker_svc.config import WorkerConfig
from worker_svc.engine import WorkerEngine
from worker_svc.servicer import WorkerServicer
from worker_svc.step_telemetry import WorkerMetrics, WorkerStepTelemetry

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
log = logging.getLogger("sluice.worker")


async def serve(config: WorkerConfig, address: str, operations: Operations) -> None:
    """Listens at once and reports NOT_SERVING while the model loads; on shutdown, drains the requests it holds."""
    async with Service([SERVICE_NAME], "sluice-worker", operations) as service:
        port = await service.start(address)
        engine = await asyncio.to_thread(WorkerEngine.load, config)
        model_name = Path(config.model).name
        telemetry = WorkerStepTelemetry(service.tracer, WorkerMetrics(service.metrics_registry, model_name))
        service.add(worker_pb2_grpc.add_WorkerServicer_to_server, WorkerServicer(engine, model_name, telemetry))
        await service.set_ready(True)
        log.info("worker serving %s on port %d", config.model, port)
        await service.wait_for_shutdown()
        drained = await service.drain(lambda: engine.num_live_requests == 0)
        log.info("worker drained" if drained else "worker drain timed out; stopping")
