"""FinishReason to and from sluice.v1's enum."""
from sluice.core.finish_reason import FinishReason
from sluice.v1 import generation_pb2 as pb

_TO_PB = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.ABORT: pb.FINISH_REASON_ABORT,
}
_FROM_PB = {value: reason for reason, value in _TO_PB.items()}


def finish_reason_to_pb(reason: FinishReason) -> int:
    return _TO_PB[FinishReason(reason.reported)]


def finish_reason_from_pb(value: int) -> FinishReason:
    """An unset or unknown reason ends a request as an abort."""
    return _FROM_PB.get(value, FinishReason.ABORT)
