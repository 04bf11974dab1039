import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

SERVING = health_pb2.HealthCheckResponse.SERVING


def test_reflection_alone_lists_and_describes_generate(services):
    with grpc.insecure_channel(services.layout.router_address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert {"sluice.v1.Generation", "grpc.health.v1.Health"} <= set(database.get_services())
        pool = DescriptorPool(database)
        generate = pool.FindServiceByName("sluice.v1.Generation").FindMethodByName("Generate")
        assert generate.input_type.full_name == "sluice.v1.GenerateRequest"
        assert generate.output_type.full_name == "sluice.v1.GenerateResponse"
        assert generate.server_streaming and not generate.client_streaming
        assert {"text", "chat", "tokens", "sampling"} <= set(generate.input_type.fields_by_name)


@pytest.mark.parametrize("address_name, readiness_name", [
    ("router_address", "sluice.v1.Generation"), ("scheduler_address", "sluice.v1.Scheduler"),
    ("worker_addresses", "sluice.v1.Worker")])  # one worker rank
def test_liveness_and_readiness_of_every_service(services, address_name, readiness_name):
    address = getattr(services.layout, address_name)
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == SERVING
        assert health.Check(health_pb2.HealthCheckRequest(service=readiness_name)).status == SERVING
        with pytest.raises(grpc.RpcError) as error:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        watch = health.Watch(health_pb2.HealthCheckRequest(service=readiness_name))
        assert next(watch).status == SERVING
        watch.cancel()
