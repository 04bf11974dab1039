"""sluice.v1.Worker's servicer: model info, the KV cache's sizing, and the Execute stream of steps."""
import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sluice.core.errors import Unimplemented
from sluice.core.images_pb import vision_info_to_pb
from sluice.core.kv_transfer_pb import kv_source_from_pb, kv_source_to_pb
from sluice.core.step_plan import StepPlan
from sluice.core.step_plan_pb import outcome_to_pb, plan_from_pb
from sluice.v1 import worker_pb2 as pb
from sluice.v1 import worker_pb2_grpc
from sluice.worker.engine import WorkerEngine
from sluice.worker.runner.cpu_threads import CpuStepThreads
from sluice.worker.runner.model_runner import LaunchedStep
from sluice.worker.step_telemetry import WorkerStepTelemetry

log = logging.getLogger("sluice.worker")


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: WorkerEngine, model_name: str, telemetry: WorkerStepTelemetry,
                 cpu_reserved_cores: int = 0):
        self.engine = engine
        self.model_name = model_name
        self.telemetry = telemetry
        self._engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-engine")
        # A CUDA launch only queues work, so steps launch and finish right on the event loop: no thread hand-offs
        # (each waits on the GIL) in a step's path. On the CPU a launch computes the step, so it runs on the thread.
        self._steps_inline = engine.device.type == "cuda"
        self._cpu_threads = None if self._steps_inline else CpuStepThreads(cpu_reserved_cores)
        # fails when a step of a tensor-parallel rank fails: the ranks' collectives are out of step for good
        self.group_broken: asyncio.Future = asyncio.get_running_loop().create_future()
        self._num_streams = 0  # Execute streams open

    @property
    def holds_requests(self) -> bool:
        """Whether a scheduler streams steps and the engine holds requests it sent. Once its stream ends, they are
        state no step reads (a scheduler that connects again sets the cache up anew), which a drain does not wait
        for: a scheduler stopped right after a request ended may not have told the worker that it had."""
        return self._num_streams > 0 and self.engine.num_live_requests > 0

    async def GetInfo(self, request: pb.GetInfoRequest, context) -> pb.WorkerInfo:
        config = self.engine.model_config
        return pb.WorkerInfo(model=self.model_name, architecture=config.architecture,
                             max_model_len=self.engine.max_model_len, vocab_size=config.vocab_size,
                             dtype=self.engine.config.dtype, eos_token_ids=config.eos_token_ids,
                             rank=self.engine.config.rank, world_size=self.engine.config.world_size,
                             pipeline_parallel_size=self.engine.config.pipeline_parallel_size,
                             draft_model=Path(self.engine.config.draft_model).name,
                             kv_cache_dtype=self.engine.config.kv_cache_dtype_name, quantization=config.quantization or "",
                             attention_window=self.engine.attention_window,
                             vision=None if config.vision is None else vision_info_to_pb(config.vision.info),
                             kv_role=self.engine.config.kv_role)

    async def InitCache(self, request: pb.InitCacheRequest, context) -> pb.InitCacheResponse:
        try:
            num_blocks = await self._on_engine_thread(self.engine.init_cache, request.block_size, request.num_blocks,
                                                      request.max_num_batched_tokens, request.max_num_seqs,
                                                      request.max_model_len, request.max_num_encoder_input_tokens,
                                                      request.encoder_cache_size)
        except Exception as error:
            self._break_group(error)
            raise
        log.info("KV cache: %d blocks of %d tokens in %s", num_blocks, request.block_size,
                 self.engine.config.kv_cache_dtype_name)
        log.info("sampler warm-up: %.2f s", self.engine.warm_up_seconds)
        self.telemetry.metrics.warm_up_seconds.set(self.engine.warm_up_seconds)
        kv_transfer = self.engine.kv_transfer
        return pb.InitCacheResponse(num_blocks=num_blocks, block_size=request.block_size,
                                    kv_source=None if kv_transfer is None else kv_source_to_pb(kv_transfer.source))

    async def PullKv(self, request: pb.PullKvRequest, context) -> pb.PullKvResponse:
        kv_transfer = self.engine.kv_transfer
        if kv_transfer is None or self.engine.config.kv_role != "decode":
            raise Unimplemented(f"this worker's kv_role is {self.engine.config.kv_role!r}, not 'decode' (or its KV "
                                "cache is not set up)")
        num_bytes = await kv_transfer.pull(kv_source_from_pb(request.source), list(request.remote_block_ids),
                                           list(request.local_block_ids), request.timeout_seconds)
        return pb.PullKvResponse(num_bytes=num_bytes)

    async def Execute(self, request_iterator, context):
        """Launches each step as it arrives and streams the outcomes back in order, so step N + 1 is queued on the
        device before step N's sampled tokens reach the host."""
        launched: asyncio.Queue = asyncio.Queue()
        launcher = asyncio.create_task(self._launch_each(request_iterator, launched))
        self._num_streams += 1
        try:
            while (item := await launched.get()) is not None:
                plan, step, started = item
                if step.arriving is not None:  # sampled on the last pipeline stage
                    await asyncio.wrap_future(step.arriving)
                while not step.ready():  # polled: a thread blocked in the driver would slow the launches
                    await asyncio.sleep(0)
                outcome = await self._run_step_call(self.engine.finish, step)
                encoder_seconds = None if step.encoder_span is None else step.encoder_span.seconds()
                self.telemetry.step_finished(plan, outcome, self.engine.num_live_requests, started, encoder_seconds)
                yield outcome_to_pb(outcome)
            await launcher  # raises what failed a launch
        except Exception as error:
            self._break_group(error)
            raise
        finally:
            launcher.cancel()
            self._num_streams -= 1

    def _break_group(self, error: Exception) -> None:
        """A rank of several that failed a call may have left its peers inside a collective or a transfer: the group
        is broken for good."""
        if self.engine.config.world_size > 1 and not self.group_broken.done():
            self.group_broken.set_exception(RuntimeError(f"rank {self.engine.config.rank}: {error}"))

    async def _launch_each(self, request_iterator, launched: asyncio.Queue) -> None:
        try:
            async for message in request_iterator:
                plan = plan_from_pb(message)
                started = self.telemetry.step_started(plan)
                await launched.put((plan, await self._run_step_call(self._launch, plan), started))
        finally:
            launched.put_nowait(None)

    def _launch(self, plan: StepPlan) -> LaunchedStep:
        if self._cpu_threads is not None:
            self._cpu_threads.set_for(plan.total_num_scheduled_tokens)
        return self.engine.launch(plan)

    async def _run_step_call(self, function, *args):
        if self._steps_inline:
            return function(*args)
        return await self._on_engine_thread(function, *args)

    def _on_engine_thread(self, function, *args):
        """Runs on the one thread that owns the engine's state (launches and finishes stay in order)."""
        return asyncio.get_running_loop().run_in_executor(self._engine_thread, function, *args)
