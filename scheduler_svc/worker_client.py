import asyncio

import grpc

from sluice.core.errors import Unavailable
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.core.step_plan_pb import outcome_from_pb, plan_to_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import worker_pb2 as pb
from sluice.v1 import worker_pb2_grpc


class WorkerClient:
    """The scheduler's end of one worker: setup calls, then one long-lived Execute stream, one message per step."""

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        self._steps: asyncio.Queue[pb.StepRequest] = asyncio.Queue()
        self._results = None

    async def get_info(self, timeout: float) -> pb.WorkerInfo:
        return await self.stub.GetInfo(pb.GetInfoRequest(), timeout=timeout, wait_for_ready=True)

    async def init_cache(self, request: pb.InitCacheRequest) -> int:
        return (await self.stub.InitCache(request)).num_blocks

    def open_stream(self) -> None:
        self._results = self.stub.Execute(self._outgoing())

    async def _outgoing(self):
        while True:
            yield await self._steps.get()

    def send(self, plan: StepPlan) -> None:
        self._steps.put_nowait(plan_to_pb(plan))

    async def receive(self) -> StepOutcome:
        """The result of the oldest step sent and not yet received."""
        try:
            result = await self._results.read()
        except grpc.aio.AioRpcError as error:
            raise Unavailable(f"worker {self.address}: {error.details()}") from error
        if result is grpc.aio.EOF:
            raise Unavailable(f"worker {self.address} closed its stream")
        return outcome_from_pb(result)

    async def close(self) -> None:
        await self.channel.close()
