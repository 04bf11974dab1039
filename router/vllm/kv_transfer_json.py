"""vLLM's kv_transfer_params as JSON (kv_transfer_params_json of vLLM's engine protocol, which smg relays verbatim
between the legs of a disaggregated request), and the KV roles as vLLM's GetServerInfo names them."""
import dataclasses
import json

from sluice.core.errors import InvalidArgument
from sluice.core.kv_transfer import KvTransferParams

VLLM_KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}  # "both" moves no KV: no connector
KV_CONNECTOR = "NixlConnector"  # what smg reads to tag prefill legs do_remote_decode and relay the params back
_TYPES = {name: type(value) for name, value in dataclasses.asdict(KvTransferParams()).items()}


def kv_transfer_from_json(text: str) -> KvTransferParams | None:
    """None for params that ask for no transfer; fields vLLM's connectors add (tp_size) are ignored."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument("kv_transfer_params_json", f"not JSON: {error}") from None
    if not isinstance(values, dict):
        raise InvalidArgument("kv_transfer_params_json", "must be a JSON object")
    known = {name: value for name, value in values.items() if name in _TYPES}
    for name, value in known.items():
        if type(value) is not _TYPES[name] or (name == "remote_block_ids" and
                                                not all(type(block) is int for block in value)):
            raise InvalidArgument(f"kv_transfer_params_json.{name}", f"must be a JSON {_TYPES[name].__name__}"
                                  + (" of integers" if name == "remote_block_ids" else ""))
    params = KvTransferParams(**known)
    return params if params.do_remote_decode or params.do_remote_prefill else None


def kv_transfer_to_json(params: KvTransferParams) -> str:
    return json.dumps(dataclasses.asdict(params))
