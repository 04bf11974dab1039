"""vLLM's kv_transfer_params_json both ways: the NIXL connector's fields, unknown ones (tp_size) ignored, bad ones
refused naming the field."""
import json

import pytest

from sluice.core.errors import InvalidArgument
from sluice.core.kv_transfer import KvTransferParams
from sluice.router.vllm.kv_transfer_json import kv_transfer_from_json, kv_transfer_to_json

LEASED = KvTransferParams(do_remote_prefill=True, remote_engine_id="e", remote_host="10.0.0.7", remote_port=50052,
                          remote_block_ids=[3, 9], remote_request_id="r")


def test_params_go_both_ways_and_a_leg_asking_nothing_is_none():
    assert kv_transfer_from_json(kv_transfer_to_json(LEASED)) == LEASED
    assert kv_transfer_from_json(json.dumps({"do_remote_decode": True, "tp_size": 1})) == \
        KvTransferParams(do_remote_decode=True)
    assert kv_transfer_from_json("{}") is None


@pytest.mark.parametrize("text, field", [("[1]", "kv_transfer_params_json"), ("{", "kv_transfer_params_json"),
                                         ('{"remote_port": "80"}', "kv_transfer_params_json.remote_port"),
                                         ('{"remote_block_ids": [1, "2"]}', "kv_transfer_params_json.remote_block_ids"),
                                         ('{"do_remote_prefill": 1}', "kv_transfer_params_json.do_remote_prefill")])
def test_bad_params_are_refused_naming_the_field(text, field):
    with pytest.raises(InvalidArgument) as refused:
        kv_transfer_from_json(text)
    assert refused.value.field == field
