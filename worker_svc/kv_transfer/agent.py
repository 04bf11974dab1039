"""A worker's NIXL agent: registers the KV cache, describes it to peers, and pulls a peer's blocks into its own."""
import asyncio
import contextlib
import time
import uuid

import numpy as np
import torch

from sluice.core.errors import InvalidArgument, Unavailable
from sluice.core.kv_transfer import KvRegion, KvSource

_POLL_SECONDS = 0.0005  # between two looks at a transfer in progress


class KvTransferAgent:
    """Every layer's key and value cache is one region of blocks laid end to end (kv_cache stores each block
    whole); a descriptor per region and block lets a transfer name any blocks, so a pull reads the peer's blocks
    straight into the local ones, layer by layer in one request. Peers are added once, by their agent's name."""

    def __init__(self, name: str, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], serves_reads: bool):
        """serves_reads: peers read this cache (a prefill worker's). NIXL's progress thread then answers them where
        the transport needs the target's help (UCX over TCP), at the cost of a core it keeps busy; a reader drives
        its own reads as it polls them, and runs none."""
        try:
            from nixl_cu12 import nixl_agent, nixl_agent_config
        except ImportError as error:
            raise RuntimeError("moving KV blocks between replicas needs NIXL: pip install 'sluice[pd]'") from error
        self.name = f"{name}-{uuid.uuid4().hex[:8]}"  # a worker set up again is a new peer
        self.agent = nixl_agent(self.name, nixl_agent_config(enable_prog_thread=serves_reads, backends=["UCX"]))
        self._kv_caches = kv_caches  # the registered memory lives as long as the agent
        key_cache = kv_caches[0][0]
        self.num_blocks = key_cache.shape[0]
        self.memory_type = "DRAM" if key_cache.device.type == "cpu" else "VRAM"
        self.device_id = max(key_cache.get_device(), 0)
        self.regions = [KvRegion(cache.data_ptr(), cache[0].numel() * cache.element_size(), self.device_id)
                        for cache in [*(k for k, _ in kv_caches), *(v for _, v in kv_caches)]]
        self.agent.register_memory([(region.address, region.block_bytes * self.num_blocks, region.device_id, "")
                                    for region in self.regions], self.memory_type)
        self._local = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", self._descriptors(self.regions, self.num_blocks),
                                                 self.memory_type)
        self._peers = {}  # agent name -> its prepped descriptor list

    @property
    def source(self) -> KvSource:
        return KvSource(self.name, self.agent.get_agent_metadata(), self.memory_type, self.num_blocks, self.regions)

    async def pull(self, source: KvSource, remote_block_ids: list[int], local_block_ids: list[int],
                   timeout: float) -> int:
        """Reads the peer's blocks into the local ones, pairwise; returns the bytes read. Unavailable when the
        transfer fails or outlasts the timeout (the peer died or hangs): the peer is forgotten."""
        self._check_matches(source)
        try:
            state = await self._read(source, remote_block_ids, local_block_ids, time.monotonic() + timeout)
        except Exception as error:  # NIXL's errors (a peer that cannot be reached) share no base but Exception
            state = repr(error)
        if state != "DONE":
            self._forget(source.agent_name)
            raise Unavailable(f"reading KV blocks from {source.agent_name}: "
                              f"{'timed out' if state == 'PROC' else state}")
        return len(local_block_ids) * sum(region.block_bytes for region in self.regions)

    async def _read(self, source: KvSource, remote_block_ids: list[int], local_block_ids: list[int],
                    deadline: float) -> str:
        """The transfer's last state: DONE, ERR, or PROC at the deadline."""
        remote = self._peer(source)
        offsets = np.arange(len(self.regions))[:, None]
        local = offsets * self.num_blocks + np.asarray(local_block_ids)[None, :]
        remote_indices = offsets * source.num_blocks + np.asarray(remote_block_ids)[None, :]
        handle = self.agent.make_prepped_xfer("READ", self._local, local.ravel().astype(np.int32), remote,
                                              remote_indices.ravel().astype(np.int32))
        try:
            state = self.agent.transfer(handle)
            while state == "PROC" and time.monotonic() < deadline:
                await asyncio.sleep(_POLL_SECONDS)
                state = self.agent.check_xfer_state(handle)
            return state
        finally:
            handle.release()

    def _check_matches(self, source: KvSource) -> None:
        mine = [region.block_bytes for region in self.regions]
        theirs = [region.block_bytes for region in source.regions]
        if mine != theirs:
            raise InvalidArgument("kv_transfer.remote_engine_id",
                                  f"the KV cache of {source.agent_name} has blocks of {theirs} bytes per layer, this "
                                  f"worker's {mine}: prefill and decode replicas must serve one model with one KV "
                                  "cache dtype, block size and tensor-parallel size")

    def _peer(self, source: KvSource):
        if source.agent_name not in self._peers:
            self.agent.add_remote_agent(source.agent_metadata)
            self._peers[source.agent_name] = self.agent.prep_xfer_dlist(
                source.agent_name, self._descriptors(source.regions, source.num_blocks), source.memory_type)
        return self._peers[source.agent_name]

    def _forget(self, agent_name: str) -> None:
        if self._peers.pop(agent_name, None) is not None:
            with contextlib.suppress(Exception):  # a peer that is gone may be gone from NIXL's view too
                self.agent.remove_remote_agent(agent_name)

    @staticmethod
    def _descriptors(regions: list[KvRegion], num_blocks: int) -> np.ndarray:
        """(address, bytes, device) of every region's every block, region after region."""
        blocks = np.arange(num_blocks, dtype=np.uint64)
        return np.concatenate([np.stack([region.address + blocks * region.block_bytes,
                                         np.full(num_blocks, region.block_bytes, dtype=np.uint64),
                                         np.full(num_blocks, region.device_id, dtype=np.uint64)], axis=1)
                               for region in regions])
