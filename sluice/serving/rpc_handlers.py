"""Helpers for server interceptors: which methods are operational, and wrapping a handler's behavior."""
from collections.abc import Callable

import grpc

OPERATIONS_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                       "grpc.reflection.v1.ServerReflection")
# Gateways' health probes, answered while not ready too (they say so in their reply): vLLM's engine protocol's.
OPERATIONS_METHODS = ("/vllm.grpc.engine.VllmEngine/HealthCheck",)

_CONSTRUCTORS = {
    (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
    (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
    (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
    (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
}


def is_operations_method(method: str) -> bool:
    """Health checks and reflection: always answered, never authenticated, drained or traced."""
    return method in OPERATIONS_METHODS or method.lstrip("/").split("/", 1)[0] in OPERATIONS_SERVICES


def with_behavior(handler: grpc.RpcMethodHandler, wrap: Callable[[Callable], Callable]) -> grpc.RpcMethodHandler:
    """The same handler with its behavior replaced by wrap(behavior)."""
    construct, attribute = _CONSTRUCTORS[(handler.request_streaming, handler.response_streaming)]
    behavior = wrap(getattr(handler, attribute))
    return construct(behavior, request_deserializer=handler.request_deserializer,
                     response_serializer=handler.response_serializer)


def rejecting_handler(code: grpc.StatusCode, details: str) -> grpc.RpcMethodHandler:
    """Ends any call at once with a status, whatever its streaming shape, without reading its requests."""
    async def reject(request_iterator, context):
        await context.abort(code, details)

    return grpc.stream_stream_rpc_method_handler(reject)
