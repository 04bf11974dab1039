"""A server's methods, looked up per call, so servicers can be added after the server has started.

A service starts listening at once (health answers NOT_SERVING while the model loads or a peer is awaited) and adds
its servicers when their collaborators exist. The generated add_*_to_server functions register into this table as
they would into a server.
"""
import grpc


class MethodTable(grpc.GenericRpcHandler):
    def __init__(self):
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []

    def add_generic_rpc_handlers(self, generic_rpc_handlers) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        for method, handler in method_handlers.items():
            self._handlers[f"/{service_name}/{method}"] = handler

    def service(self, handler_call_details):
        handler = self._handlers.get(handler_call_details.method)
        if handler is not None:
            return handler
        return next(filter(None, (g.service(handler_call_details) for g in self._generic)), None)
