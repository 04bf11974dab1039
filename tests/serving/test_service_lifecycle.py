import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.serving.operations import Operations
from sluice.serving.service import Service
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import generation_pb2_grpc
from tests.serving.fake_generation import FakeGeneration

NAME = "sluice.v1.Generation"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(channel, service: str) -> int:
    health = health_pb2_grpc.HealthStub(channel)
    return (await health.Check(health_pb2.HealthCheckRequest(service=service))).status


async def _code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_unavailable_until_ready_and_servicers_added_after_start():
    async def scenario():
        async with Service([NAME], "test", Operations()) as service:
            port = await service.start("127.0.0.1:0")
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = generation_pb2_grpc.GenerationStub(channel)
                assert await _status(channel, "") == SERVING
                assert await _status(channel, NAME) == NOT_SERVING
                assert await _code_of(stub.Tokenize(pb.TokenizeRequest(text="hi"))) == grpc.StatusCode.UNAVAILABLE
                service.add(generation_pb2_grpc.add_GenerationServicer_to_server, FakeGeneration())
                await service.set_ready(True)
                assert await _status(channel, NAME) == SERVING
                assert list((await stub.Tokenize(pb.TokenizeRequest(text="hi"))).token_ids) == [1, 2, 3]

    asyncio.run(scenario())


def test_drain_finishes_streams_in_flight_and_turns_new_calls_away():
    async def scenario():
        operations = Operations(drain_timeout=10.0)
        fake = FakeGeneration()
        async with Service([NAME], "test", operations) as service:
            port = await service.start("127.0.0.1:0")
            service.add(generation_pb2_grpc.add_GenerationServicer_to_server, fake)
            await service.set_ready(True)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = generation_pb2_grpc.GenerationStub(channel)
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=NAME))
                assert (await watch.read()).status == SERVING
                stream = stub.Generate(pb.GenerateRequest(text="hi"))
                assert (await stream.read()).chunk.text == "first"

                operations.shutdown.set()
                await service.wait_for_shutdown()
                drain = asyncio.create_task(service.drain())
                assert (await watch.read()).status == NOT_SERVING
                assert await _code_of(stub.Tokenize(pb.TokenizeRequest(text="hi"))) == grpc.StatusCode.UNAVAILABLE
                assert not drain.done()
                fake.release.set()
                assert (await stream.read()).HasField("complete")
                assert await drain

    asyncio.run(scenario())


def test_drain_gives_up_after_its_timeout():
    async def scenario():
        fake = FakeGeneration()
        async with Service([NAME], "test", Operations(drain_timeout=0.2)) as service:
            port = await service.start("127.0.0.1:0")
            service.add(generation_pb2_grpc.add_GenerationServicer_to_server, fake)
            await service.set_ready(True)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stream = generation_pb2_grpc.GenerationStub(channel).Generate(pb.GenerateRequest(text="hi"))
                await stream.read()
                assert not await service.drain()

    asyncio.run(scenario())
