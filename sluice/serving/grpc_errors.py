"""One server interceptor that maps domain errors (sluice.core.errors) to gRPC status codes."""
import grpc

from sluice.core import errors
from sluice.serving.rpc_handlers import is_operations_method

_STATUS = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.DataLoss: grpc.StatusCode.DATA_LOSS,
    errors.Unimplemented: grpc.StatusCode.UNIMPLEMENTED,
}


def status_for(error: errors.SluiceError) -> grpc.StatusCode:
    return _STATUS.get(type(error), grpc.StatusCode.INTERNAL)


class DomainErrorInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or is_operations_method(handler_call_details.method):
            return handler  # health's Watch writes through its context: it is no async generator
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            _unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer)


def _unary(behavior):
    async def wrapped(request, context):
        try:
            return await behavior(request, context)
        except errors.SluiceError as error:
            await context.abort(status_for(error), str(error))

    return wrapped


def _streaming(behavior):
    async def wrapped(request, context):
        try:
            async for response in behavior(request, context):
                yield response
        except errors.SluiceError as error:
            await context.abort(status_for(error), str(error))

    return wrapped
