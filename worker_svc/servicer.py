import asyncio

from scheduler_svc.step_plan_pb import outcome_to_pb, plan_from_pb
from sluice.v1 import worker_pb2 as pb
from sluice.v1 import worker_pb2_grpc
from worker_svc.engine import WorkerEngine
from worker_svc.step_telemetry import WorkerStepTelemetry


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: WorkerEngine, model_name: str, telemetry: WorkerStepTelemetry):
        self.engine = engine
        self.model_name = model_name
        self.telemetry = telemetry

    async def GetInfo(self, request: pb.GetInfoRequest, context) -> pb.WorkerInfo:
        config = self.engine.model_config
        return pb.WorkerInfo(model=self.model_name, architecture=config.architecture,
                             max_model_len=config.max_position_embeddings, vocab_size=config.vocab_size,
                             dtype=self.engine.config.dtype, eos_token_ids=config.eos_token_ids, rank=0, world_size=1)

    async def InitCache(self, request: pb.InitCacheRequest, context) -> pb.InitCacheResponse:
        num_blocks = await asyncio.to_thread(self.engine.init_cache, request.block_size, request.num_blocks,
                                             request.max_num_batched_tokens, request.max_num_seqs,
                                             request.max_model_len)
        return pb.InitCacheResponse(num_blocks=num_blocks, block_size=request.block_size)

    async def Execute(self, request_iterator, context):
        async for step in request_iterator:
            plan = plan_from_pb(step)
            self.telemetry.step_started(plan)
            outcome = await asyncio.to_thread(self.engine.execute, plan)
            self.telemetry.step_finished(plan, outcome, self.engine.num_live_requests)
            yield outcome_to_pb(outcome)
