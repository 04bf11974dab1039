"""The scheduler process: connects its worker group, sizes the KV cache, and runs the engine loop until drained."""
import asyncio
import contextlib
import dataclasses
import logging
import socket

from sluice.core.images_pb import vision_info_from_pb
from sluice.core.kv_transfer import KvTransferParams
from sluice.core.options import as_flags
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.engine_loop import EngineLoop
from sluice.scheduler.kv_cache.event_log import KvEventLog
from sluice.scheduler.routers.sessions import RouterSessions
from sluice.scheduler.scheduler import Scheduler
from sluice.scheduler.servicer import SchedulerServicer
from sluice.scheduler.telemetry.load_metrics import SchedulerLoadCollector
from sluice.scheduler.telemetry.metrics import SchedulerMetrics
from sluice.scheduler.telemetry.requests import SchedulerTelemetry
from sluice.scheduler.workers.client import WorkerClient
from sluice.scheduler.workers.group import WorkerGroup
from sluice.scheduler.workers.supervisor import WorkerSupervisor
from sluice.serving.operations import Operations
from sluice.serving.service import Service
from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc, worker_pb2

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name
log = logging.getLogger("sluice.scheduler")


async def serve(worker_addresses: list[str], address: str, operations: Operations, num_blocks: int = 0,
                worker_timeout: float = 600.0, **scheduler_options) -> None:
    """worker_addresses: the replica's ranks (the tensor-parallel ranks of each pipeline stage), in rank order (one
    for an unsharded replica). num_blocks 0 asks the workers to size the KV cache from their memory budget; scheduler_options are the
    remaining SchedulerConfig fields. Not ready until every worker is connected, nor while one is lost (then its
    methods still answer, refusing new requests with UNAVAILABLE); on shutdown, drains the requests it holds."""
    log.info("scheduler settings: %s", " ".join(as_flags({"num_blocks": num_blocks, **scheduler_options},
                                                         SchedulerConfig)))
    if len(worker_addresses) > 1 and scheduler_options.get("speculative_method"):
        raise ValueError("speculative decoding needs an unsharded worker (one rank: tensor- and pipeline-parallel "
                         "size 1)")
    async with Service([SERVICE_NAME], "sluice-scheduler", operations) as service:
        port = await service.start(address)
        worker = WorkerGroup([WorkerClient(worker_address) for worker_address in worker_addresses])
        supervisor = None
        try:
            started = await service.unless_shutdown(
                _start_worker(worker, worker_timeout, num_blocks, scheduler_options))
            if started is None:
                return
            info, config = started
            sessions = RouterSessions()
            vision = vision_info_from_pb(info.vision) if info.HasField("vision") else None
            scheduler = Scheduler(config, set(info.eos_token_ids), attention_window=info.attention_window,
                                  vision=vision, pipeline_parallel_size=info.pipeline_parallel_size or 1)
            scheduler.kv_leases.origin = KvTransferParams(remote_host=_advertised_host(address), remote_port=port)
            metrics = SchedulerMetrics(service.metrics_registry, info.model)
            service.metrics_registry.register(SchedulerLoadCollector(scheduler, info.model))
            loop = EngineLoop(scheduler, worker, sessions,
                              SchedulerTelemetry(scheduler, service.tracer, metrics, info.model), KvEventLog())
            model_info = generation_pb2.ModelInfo(model=info.model, architecture=info.architecture,
                                                  max_model_len=config.max_model_len, vocab_size=info.vocab_size,
                                                  dtype=info.dtype, num_kv_blocks=config.num_blocks,
                                                  block_size=config.block_size,
                                                  eos_token_ids=sorted(info.eos_token_ids),
                                                  kv_cache_dtype=info.kv_cache_dtype, quantization=info.quantization,
                                                  kv_role=config.kv_role,
                                                  vision=info.vision if info.HasField("vision") else None)
            service.add(scheduler_pb2_grpc.add_SchedulerServicer_to_server,
                        SchedulerServicer(loop, sessions, model_info))
            await service.set_ready(True)
            supervisor = asyncio.create_task(WorkerSupervisor(loop, worker, service.report_ready).run())
            log.info("scheduler on port %d: %d KV blocks of %d tokens in %s", port, config.num_blocks,
                     config.block_size, info.kv_cache_dtype)
            await service.wait_for_shutdown(supervisor)
            loop.admitting = False
            drained = await service.drain(lambda: not loop.has_unfinished_requests)
            log.info("scheduler drained" if drained else "scheduler drain timed out; stopping")
        finally:
            if supervisor is not None:
                supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await supervisor
                await loop.kv_pulls.close()
            await worker.close()


async def _start_worker(worker: WorkerGroup, timeout: float, num_blocks: int,
                        scheduler_options: dict) -> tuple[worker_pb2.WorkerInfo, SchedulerConfig]:
    info = await worker.get_info(timeout)
    _check_draft_model(info, scheduler_options.get("speculative_method"))
    max_model_len = min(scheduler_options.pop("max_model_len", info.max_model_len), info.max_model_len)
    config = SchedulerConfig(num_blocks=num_blocks, max_model_len=max_model_len, **scheduler_options)
    if info.kv_role != config.kv_role:
        raise ValueError(f"the workers' kv_role is {info.kv_role!r}, the scheduler's {config.kv_role!r}: start "
                         "both with the same --kv-role")
    if config.kv_role != "both" and (info.attention_window or info.draft_model):
        raise ValueError("a model whose every layer has a sliding window (it frees blocks as requests advance), or "
                         "a draft model's KV cache, does not move between replicas: kv_role 'both' only")
    num_blocks = await worker.start(worker_pb2.InitCacheRequest(
        block_size=config.block_size, num_blocks=num_blocks, max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs, max_model_len=config.max_model_len,
        max_num_encoder_input_tokens=config.max_num_encoder_input_tokens, encoder_cache_size=config.encoder_cache_size))
    return info, dataclasses.replace(config, num_blocks=num_blocks)


def _advertised_host(address: str) -> str:
    """The host decode replicas reach this one at: the listening host, or for a wildcard the address this machine's
    name resolves to (a Kubernetes pod's own IP)."""
    host = address.rsplit(":", 1)[0]
    return socket.gethostbyname(socket.gethostname()) if host in ("", "0.0.0.0", "[::]") else host


def _check_draft_model(info: worker_pb2.WorkerInfo, speculative_method: str | None) -> None:
    """Speculative method "draft" needs a worker with a draft model, which runs beside the target in every step
    (its KV cache follows the target's): a worker that has one is only of use to that method."""
    if speculative_method == "draft" and not info.draft_model:
        raise ValueError("speculative method 'draft' needs a worker started with --draft-model")
    if info.draft_model and speculative_method != "draft":
        raise ValueError(f"the worker runs draft model {info.draft_model!r}: start the scheduler with "
                         "--speculative-method draft, or the worker without --draft-model")
