"""The worker process (one rank of a replica: a tensor-parallel rank of a pipeline stage): joins its group, loads the
model, serves sluice.v1.Worker."""
import asyncio
import logging
from datetime import timedelta
from pathlib import Path

import torch

from sluice.core.options import as_flags
from sluice.serving.operations import Operations
from sluice.serving.service import Service
from sluice.v1 import worker_pb2, worker_pb2_grpc
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.parallel.group import ReplicaGroups, join_replica
from sluice.worker.servicer import WorkerServicer
from sluice.worker.step_telemetry import WorkerMetrics, WorkerStepTelemetry

SERVICE_NAME = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
log = logging.getLogger("sluice.worker")


async def serve(config: WorkerConfig, address: str, operations: Operations) -> None:
    """Listens at once and reports NOT_SERVING while the ranks meet and the model loads; on shutdown, drains the
    requests it holds while their scheduler streams steps. A rank of several whose step fails (a lost or stuck
    peer) raises: its group is broken, and the ranks serve again only once all of them start over."""
    log.info("worker settings: %s", " ".join(as_flags(config, WorkerConfig)))
    async with Service([SERVICE_NAME], "sluice-worker", operations) as service:
        port = await service.start(address)
        groups = ReplicaGroups(None, None)
        if config.world_size > 1:
            groups = await asyncio.to_thread(_join, config)
        engine = await asyncio.to_thread(WorkerEngine.load, config, groups)
        model_name = Path(config.model).name
        telemetry = WorkerStepTelemetry(service.tracer, WorkerMetrics(service.metrics_registry, model_name))
        servicer = WorkerServicer(engine, model_name, telemetry, config.cpu_reserved_cores)
        service.add(worker_pb2_grpc.add_WorkerServicer_to_server, servicer)
        await service.set_ready(True)
        log.info("worker rank %d of %d serving %s on port %d", config.rank, config.world_size,
                 config.model, port)
        await service.wait_for_shutdown(*([servicer.group_broken] if config.world_size > 1 else []))
        drained = await service.drain(lambda: not servicer.holds_requests)
        log.info("worker drained" if drained else "worker drain timed out; stopping")


def _join(config: WorkerConfig) -> ReplicaGroups:
    return join_replica(config.rank, config.tensor_parallel_size, config.pipeline_parallel_size,
                        config.dist_init_address, torch.device(config.device), timedelta(seconds=config.dist_timeout))
