import asyncio
import shutil
import subprocess

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from sluice.serving.auth import BearerTokenAuth
from sluice.serving.operations import Operations
from sluice.serving.service import Service
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc
from tests.serving.fake_generation import FakeGeneration

NAME = "sluice.v1.Generation"


async def _serve(interceptors=(), credentials=None) -> tuple[Service, int]:
    service = Service([NAME], "test", Operations(), interceptors, credentials)
    port = await service.start("127.0.0.1:0")
    service.add(generation_pb2_grpc.add_GenerationServicer_to_server, FakeGeneration())
    await service.set_ready(True)
    return service, port


async def _tokenize(channel, metadata=None) -> grpc.StatusCode:
    try:
        await generation_pb2_grpc.GenerationStub(channel).Tokenize(pb.TokenizeRequest(text="hi"), metadata=metadata)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_bearer_token_is_required_except_for_health_and_reflection():
    async def scenario():
        service, port = await _serve([BearerTokenAuth("s3cret")])
        async with service, grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await _tokenize(channel) == grpc.StatusCode.UNAUTHENTICATED
            assert await _tokenize(channel, [("authorization", "Bearer wrong")]) == grpc.StatusCode.UNAUTHENTICATED
            assert await _tokenize(channel, [("authorization", "Bearer s3cret")]) == grpc.StatusCode.OK
            health = health_pb2_grpc.HealthStub(channel)
            response = await health.Check(health_pb2.HealthCheckRequest(service=NAME))
            assert response.status == health_pb2.HealthCheckResponse.SERVING
            assert NAME in await asyncio.to_thread(_services_by_reflection, port)

    asyncio.run(scenario())


def _services_by_reflection(port: int) -> list[str]:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return ProtoReflectionDescriptorDatabase(channel).get_services()


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for localhost: (cert.pem, key.pem)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_tls(certificate):
    cert, key = certificate

    async def scenario():
        credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
        service, port = await _serve(credentials=credentials)
        async with service:
            secure = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            async with grpc.aio.secure_channel(f"localhost:{port}", secure) as channel:
                assert await _tokenize(channel) == grpc.StatusCode.OK
            async with grpc.aio.insecure_channel(f"localhost:{port}") as channel:
                assert await _tokenize(channel) == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_sluice_client_sends_its_token_over_tls(certificate):
    from sluice.client import SluiceClient, text_request

    cert, key = certificate

    def generate(port: int, token: str | None) -> str:
        with SluiceClient(f"localhost:{port}", token, cert.read_bytes()) as client:
            try:
                return client.generate(text_request("hi")).text
            except grpc.RpcError as error:
                return error.code().name

    async def scenario():
        credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
        service = Service([NAME], "test", Operations(), [BearerTokenAuth("s3cret")], credentials)
        port = await service.start("127.0.0.1:0")
        generation = FakeGeneration()
        generation.release.set()
        service.add(generation_pb2_grpc.add_GenerationServicer_to_server, generation)
        await service.set_ready(True)
        async with service:
            assert await asyncio.to_thread(generate, port, "s3cret") == "first"
            assert await asyncio.to_thread(generate, port, None) == "UNAUTHENTICATED"

    asyncio.run(scenario())
