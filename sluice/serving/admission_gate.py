"""Admits calls to a service's own methods only while it is ready, and counts those in flight for a drain."""
import inspect

import grpc

from sluice.serving.rpc_handlers import is_operations_method, rejecting_handler, with_behavior


class AdmissionGate(grpc.aio.ServerInterceptor):
    def __init__(self):
        self.open = False
        self.num_in_flight = 0

    async def intercept_service(self, continuation, handler_call_details):
        if is_operations_method(handler_call_details.method):
            return await continuation(handler_call_details)
        if not self.open:
            return rejecting_handler(grpc.StatusCode.UNAVAILABLE, "the server is not ready or is draining")
        handler = await continuation(handler_call_details)
        return None if handler is None else with_behavior(handler, self._counted)

    def _counted(self, behavior):
        if inspect.isasyncgenfunction(behavior):
            async def counted_stream(request, context):
                self.num_in_flight += 1
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    self.num_in_flight -= 1

            return counted_stream

        async def counted(request, context):
            self.num_in_flight += 1
            try:
                return await behavior(request, context)
            finally:
                self.num_in_flight -= 1

        return counted
