"""The router's settings."""
from dataclasses import dataclass

from sluice.core.options import option
from sluice.serving.grpc_options import MAX_CLIENT_REQUEST_BYTES


@dataclass(slots=True)
class RouterConfig:
    max_request_bytes: int = option(MAX_CLIENT_REQUEST_BYTES,
                                    help="a larger client message gets RESOURCE_EXHAUSTED before it is read")

    def __post_init__(self):
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
