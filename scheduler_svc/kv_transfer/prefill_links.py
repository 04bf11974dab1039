"""A decode replica's links to the prefill replicas its requests name: their KV sources, and the end of each lease."""
import asyncio
import logging

import grpc

from sluice.core.errors import Unavailable
from sluice.core.kv_transfer import KvSource, KvTransferParams
from sluice.core.kv_transfer_pb import kv_source_from_pb
from sluice.serving.grpc_options import CHANNEL_OPTIONS
from sluice.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger("sluice.scheduler")
_RELEASE_TIMEOUT_SECONDS = 5.0  # past it, the lease ends on its own


class PrefillLinks:
    def __init__(self):
        self._stubs: dict[str, scheduler_pb2_grpc.SchedulerStub] = {}
        self._channels: list[grpc.aio.Channel] = []
        self._sources: dict[str, tuple[str, list[KvSource]]] = {}  # address -> (engine id, each rank's source)
        self._releases: set[asyncio.Task] = set()

    async def sources(self, params: KvTransferParams, timeout: float) -> list[KvSource]:
        """Each rank's KV source of the prefill replica the params name; Unavailable when it cannot be reached or
        has set its cache up again since it leased the blocks (its engine id changed)."""
        address = params.remote_address
        known = self._sources.get(address)
        if known is None or known[0] != params.remote_engine_id:
            try:
                reply = await self._stub(address).GetKvSources(scheduler_pb2.GetKvSourcesRequest(), timeout=timeout)
            except grpc.aio.AioRpcError as error:
                raise Unavailable(f"the prefill replica at {address}: {error.code().name} {error.details()}") \
                    from error
            known = self._sources[address] = (reply.engine_id, [kv_source_from_pb(rank) for rank in reply.ranks])
        if known[0] != params.remote_engine_id:
            raise Unavailable(f"the prefill replica at {address} set its KV cache up again: the blocks are gone")
        return known[1]

    def release(self, params: KvTransferParams) -> None:
        """Ends the lease, in the background: a prefill replica that cannot be told lets it expire."""
        task = asyncio.create_task(self._release(params))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, params: KvTransferParams) -> None:
        try:
            await self._stub(params.remote_address).ReleaseKv(
                scheduler_pb2.ReleaseKvRequest(request_id=params.remote_request_id), timeout=_RELEASE_TIMEOUT_SECONDS)
        except grpc.aio.AioRpcError as error:
            log.warning("could not end the lease of %s at %s (it expires on its own): %s", params.remote_request_id,
                        params.remote_address, error.details())

    def _stub(self, address: str) -> scheduler_pb2_grpc.SchedulerStub:
        if address not in self._stubs:
            channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels.append(channel)
            self._stubs[address] = scheduler_pb2_grpc.SchedulerStub(channel)
        return self._stubs[address]

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()
