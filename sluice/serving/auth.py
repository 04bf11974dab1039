"""Optional bearer-token authentication: `authorization: Bearer <token>` on every call but health and reflection."""
import hmac

import grpc

from sluice.serving.rpc_handlers import is_operations_method, rejecting_handler


class BearerTokenAuth(grpc.aio.ServerInterceptor):
    def __init__(self, token: str):
        if not token:
            raise ValueError("the auth token is empty")
        self._expected = f"Bearer {token}".encode()

    async def intercept_service(self, continuation, handler_call_details):
        if is_operations_method(handler_call_details.method) or self._authorized(handler_call_details):
            return await continuation(handler_call_details)
        return rejecting_handler(grpc.StatusCode.UNAUTHENTICATED, "a valid 'authorization: Bearer' token is required")

    def _authorized(self, handler_call_details) -> bool:
        metadata = dict(handler_call_details.invocation_metadata or ())
        presented = metadata.get("authorization", "")
        return hmac.compare_digest(presented.encode() if isinstance(presented, str) else presented, self._expected)
