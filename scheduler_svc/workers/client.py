"""The scheduler's end of one worker: setup calls, then the Execute stream, one message per step."""
import asyncio

import grpc

from sluice.core.errors import Unavailable
from sluice.core.kv_transfer import KvSource
from sluice.core.kv_transfer_pb import kv_source_from_pb, kv_source_to_pb
from sluice.core.step_plan import StepOutcome
from sluice.core.step_plan_pb import outcome_from_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.serving.readiness import wait_until_serving
from sluice.v1 import worker_pb2 as pb
from sluice.v1 import worker_pb2_grpc

WORKER_SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Worker"].full_name
_EXECUTE = f"/{WORKER_SERVICE_NAME}/Execute"


class WorkerClient:
    """The scheduler's end of one worker: setup calls, then one long-lived Execute stream, one message per step.
    Every failure of the worker surfaces as Unavailable; the client can start again once the worker is back."""

    def __init__(self, address: str):
        self.address = address
        self.channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)
        # steps go out as bytes serialised once for every rank (WorkerGroup.send)
        self._execute = self.channel.stream_stream(_EXECUTE, response_deserializer=pb.StepResult.FromString)
        self.info: pb.WorkerInfo | None = None  # what the worker serves, as it first said
        self.kv_source: KvSource | None = None  # of a prefill or decode worker: where its KV cache lies
        self._cache: pb.InitCacheRequest | None = None  # the KV cache it set up, to set up again after a loss
        self._steps: asyncio.Queue[bytes | None] = asyncio.Queue()  # None ends the stream's steps
        self._results = None

    @property
    def streaming(self) -> bool:
        """Whether the Execute stream is open: false before start() and once the worker is lost."""
        return self._results is not None and not self._results.done()

    async def get_info(self, timeout: float) -> pb.WorkerInfo:
        """Waits until the worker serves, then asks it what it serves."""
        self.info = await self._serving_info(timeout)
        return self.info

    async def start(self, cache: pb.InitCacheRequest) -> int:
        """Sets up the worker's KV cache and opens the Execute stream. Returns the number of KV blocks the worker
        allocated."""
        response = await self._call(self.stub.InitCache(cache))
        num_blocks = response.num_blocks
        self.kv_source = kv_source_from_pb(response.kv_source) if response.HasField("kv_source") else None
        self._cache = pb.InitCacheRequest()
        self._cache.CopyFrom(cache)
        self._cache.num_blocks = num_blocks
        self.abandon()
        self._steps = asyncio.Queue()  # steps queued for a lost stream are dropped with it
        self._results = self._execute(self._outgoing(self._steps))
        return num_blocks

    def abandon(self) -> None:
        """Cancels the Execute stream, if one is open, and ends its steps' iterator (which gRPC would leave waiting
        for good when the stream ended on its own)."""
        self._steps.put_nowait(None)
        if self._results is not None:
            self._results.cancel()

    async def restart(self) -> None:
        """Sets up a worker that came back after a loss as it was: the same model, the same number of KV blocks."""
        info = await self._serving_info(float("inf"))
        if info != self.info:
            raise RuntimeError(f"the worker at {self.address} came back serving {info}, not {self.info}; restart "
                               "the scheduler to serve it")
        await self.start(self._cache)

    async def _serving_info(self, timeout: float) -> pb.WorkerInfo:
        await self._call(wait_until_serving(self.channel, WORKER_SERVICE_NAME, timeout))
        return await self._call(self.stub.GetInfo(pb.GetInfoRequest()))

    @staticmethod
    async def _outgoing(steps: asyncio.Queue):
        while (step := await steps.get()) is not None:
            yield step

    def send(self, step: bytes) -> None:
        """step: a serialised StepRequest."""
        self._steps.put_nowait(step)

    async def receive(self) -> StepOutcome:
        """The result of the oldest step sent and not yet received."""
        return outcome_from_pb(await self.receive_marker())

    async def receive_marker(self) -> pb.StepResult:
        """The oldest step's result as it came: from a rank that does not sample, only a completion marker."""
        result = await self._call(self._results.read())
        if result is grpc.aio.EOF:
            raise Unavailable(f"worker {self.address} closed its stream")
        return result

    async def pull_kv(self, source: KvSource, remote_block_ids: list[int], local_block_ids: list[int],
                      timeout: float) -> int:
        """Has the worker read a prefill worker's blocks into its own; returns the bytes read."""
        request = pb.PullKvRequest(source=kv_source_to_pb(source), remote_block_ids=remote_block_ids,
                                   local_block_ids=local_block_ids, timeout_seconds=timeout)
        return (await self._call(self.stub.PullKv(request, timeout=2 * timeout))).num_bytes

    async def check_streaming(self) -> None:
        """Raises Unavailable if the Execute stream has ended, as it does when the worker goes away."""
        if self._results.done():
            raise Unavailable(f"worker {self.address}: {await self._results.details()}")

    async def _call(self, call):
        try:
            return await call
        except grpc.aio.AioRpcError as error:
            raise Unavailable(f"worker {self.address}: {error.details()}") from error

    async def close(self) -> None:
        self.abandon()
        await self.channel.close()
