"""KV transfer parameters and sources on the wire (scheduler.proto, worker.proto)."""
from sluice.core.kv_transfer import KvRegion, KvSource, KvTransferParams
from sluice.v1 import scheduler_pb2, worker_pb2


def kv_transfer_to_pb(params: KvTransferParams) -> scheduler_pb2.KvTransferParams:
    return scheduler_pb2.KvTransferParams(
        do_remote_decode=params.do_remote_decode, do_remote_prefill=params.do_remote_prefill,
        remote_engine_id=params.remote_engine_id, remote_host=params.remote_host, remote_port=params.remote_port,
        remote_block_ids=params.remote_block_ids, remote_request_id=params.remote_request_id)


def kv_transfer_from_pb(message: scheduler_pb2.KvTransferParams) -> KvTransferParams | None:
    """None for a message that asks for nothing (a request that is no leg of a disaggregated one)."""
    if not (message.do_remote_decode or message.do_remote_prefill):
        return None
    return KvTransferParams(message.do_remote_decode, message.do_remote_prefill, message.remote_engine_id,
                            message.remote_host, message.remote_port, list(message.remote_block_ids),
                            message.remote_request_id)


def kv_source_to_pb(source: KvSource) -> worker_pb2.KvSource:
    return worker_pb2.KvSource(
        agent_name=source.agent_name, agent_metadata=source.agent_metadata, memory_type=source.memory_type,
        num_blocks=source.num_blocks,
        regions=[worker_pb2.KvRegion(address=region.address, block_bytes=region.block_bytes,
                                     device_id=region.device_id) for region in source.regions])


def kv_source_from_pb(message: worker_pb2.KvSource) -> KvSource:
    return KvSource(message.agent_name, message.agent_metadata, message.memory_type, message.num_blocks,
                    [KvRegion(region.address, region.block_bytes, region.device_id) for region in message.regions])
