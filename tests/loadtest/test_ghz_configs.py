"""The ghz configs name a real streaming call, rely on reflection (no proto files), and carry request data that the
protobuf JSON mapping parses into a GenerateRequest."""
import json
from pathlib import Path

import pytest
from google.protobuf import json_format

from sluice.v1 import generation_pb2 as pb

LOADTEST = Path(__file__).parents[2] / "loadtest"
CONFIGS = sorted(LOADTEST.glob("*.json"))
GHZ_KEYS = {"call", "host", "insecure", "total", "concurrency", "connections", "qps", "duration", "max-duration",
            "timeout", "data", "metadata", "cacert", "cname", "skipTLS", "name", "tags", "connect-timeout",
            "keepalive", "format", "output"}


def load_requests(config: dict) -> list[pb.GenerateRequest]:
    data = config["data"] if isinstance(config["data"], list) else [config["data"]]
    return [json_format.ParseDict(item, pb.GenerateRequest()) for item in data]


def test_there_are_configs():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_a_streaming_generate_through_reflection(path):
    config = json.loads(path.read_text())
    assert set(config) <= GHZ_KEYS
    assert "proto" not in config and "protoset" not in config
    service_name, method_name = config["call"].rsplit(".", 1)
    service = pb.DESCRIPTOR.services_by_name[service_name.removeprefix("sluice.v1.")]
    method = service.methods_by_name[method_name]
    assert method.server_streaming and method.input_type is pb.GenerateRequest.DESCRIPTOR


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_request_data_parses_into_generate_request(path):
    for request in load_requests(json.loads(path.read_text())):
        assert request.WhichOneof("input") in ("text", "chat", "tokens")
        assert request.sampling.HasField("max_tokens")
