"""A server's methods, looked up per call, so servicers can be added after the server has started.

A service starts listening at once (health answers NOT_SERVING while the model loads or a peer is awaited) and adds
its servicers when their collaborators exist. The generated add_*_to_server functions register into this table as
they would into a server. Unary requests are decoded inside the method (request_decoding), so a message that does not
parse is INVALID_ARGUMENT.
"""
import grpc
from google.protobuf import descriptor_pool

from sluice.serving.request_decoding import decoded_in_behavior


class MethodTable(grpc.GenericRpcHandler):
    def __init__(self):
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, generic_rpc_handlers) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        service = descriptor_pool.Default().FindServiceByName(service_name)
        for method, handler in method_handlers.items():
            request_type = service.FindMethodByName(method).input_type
            self._handlers[f"/{service_name}/{method}"] = decoded_in_behavior(handler, request_type)

    def service(self, handler_call_details):
        handler = self._handlers.get(handler_call_details.method)
        if handler is not None:
            return handler
        return next(filter(None, (g.service(handler_call_details) for g in self._generic)), None)
