"""Domain errors; the service layer maps each to a gRPC status code (sluice.serving.grpc_errors)."""
class SluiceError(Exception):
    """A domain error that the service layer maps to a gRPC status code."""


class InvalidArgument(SluiceError):
    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field


class ResourceExhausted(SluiceError):
    pass


class Unavailable(SluiceError):
    pass


class DeadlineExceeded(SluiceError):
    pass


class NotFound(SluiceError):
    pass


class OutOfRange(SluiceError):
    pass


class DataLoss(SluiceError):
    pass


class Unimplemented(SluiceError):
    pass
