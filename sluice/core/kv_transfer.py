"""Prefill/decode disaggregation's shared types: a request leg's KV transfer parameters (vLLM's kv_transfer_params)
and where a worker's KV cache lies for its NIXL peers."""
from dataclasses import dataclass, field

KV_ROLES = ("both", "prefill", "decode")  # both: a replica that prefills and decodes its own requests, as ever


@dataclass(slots=True)
class KvTransferParams:
    do_remote_decode: bool = False  # a prefill leg: end at the first token, hold the prompt's full blocks on lease
    do_remote_prefill: bool = False  # a decode leg: pull the prompt's full blocks from the prefill replica
    remote_engine_id: str = ""  # the prefill replica's KV sources, as it names them
    remote_host: str = ""  # the prefill replica's scheduler
    remote_port: int = 0
    remote_block_ids: list[int] = field(default_factory=list)  # the prompt's full blocks on the prefill replica
    remote_request_id: str = ""  # the lease's

    @property
    def remote_address(self) -> str:
        return f"{self.remote_host}:{self.remote_port}"


@dataclass(slots=True)
class KvRegion:
    """One layer's keys or values: blocks of block_bytes laid end to end from address."""

    address: int
    block_bytes: int
    device_id: int = 0


@dataclass(slots=True)
class KvSource:
    """A worker's KV cache as a NIXL peer reads it."""

    agent_name: str
    agent_metadata: bytes
    memory_type: str  # NIXL's: "DRAM" or "VRAM"
    num_blocks: int
    regions: list[KvRegion]  # every layer's keys, then its values, in layer order
