"""A prefill replica's leases: the prompt blocks of finished prefill legs, held until their decode replica has pulled
them, gives up, or the lease expires."""
import dataclasses
from collections.abc import Callable

from sluice.core.kv_transfer import KvTransferParams
from sluice.scheduler.kv_cache.block_manager import BlockManager
from sluice.scheduler.request import Request


class KvLeases:
    def __init__(self, block_manager: BlockManager, timeout: float, clock: Callable[[], float]):
        self.block_manager = block_manager
        self.timeout = timeout
        self.clock = clock
        self.origin = KvTransferParams()  # this replica as decode replicas reach it (engine id, host, port)
        self.num_expired = 0
        self._leases: dict[str, tuple[list, float]] = {}  # request id -> (held blocks, expiry), in expiry order

    def __len__(self) -> int:
        return len(self._leases)

    def hold(self, request: Request) -> KvTransferParams:
        """Holds the request's full prompt blocks; the params that name them to the decode leg."""
        self.release(request.request_id)
        blocks = self.block_manager.hold_prompt_blocks(request)
        self._leases[request.request_id] = (blocks, self.clock() + self.timeout)
        return dataclasses.replace(self.origin, do_remote_prefill=True, remote_request_id=request.request_id,
                                   remote_block_ids=[block.block_id for block in blocks])

    def release(self, request_id: str) -> bool:
        lease = self._leases.pop(request_id, None)
        if lease is not None:
            self.block_manager.release_held(lease[0])
        return lease is not None

    def expire(self) -> None:
        now = self.clock()
        while self._leases and (first := next(iter(self._leases.items())))[1][1] <= now:
            self.release(first[0])
            self.num_expired += 1

    def release_all(self) -> None:
        for request_id in list(self._leases):
            self.release(request_id)
