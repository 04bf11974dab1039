"""The routers' streams: which one owns which request, and each step's updates fanned out to them."""
from collections import defaultdict
from collections.abc import Iterable

from sluice.core.errors import SluiceError
from sluice.scheduler.outputs import RequestUpdate
from sluice.scheduler.routers.outbox import Outbox
from sluice.scheduler.routers.updates_pb import step_update_to_pb
from sluice.serving.grpc_errors import status_for
from sluice.v1 import scheduler_pb2 as pb


class RouterSessions:
    """Which router stream owns which request; fans each step's updates out as one message per router."""

    def __init__(self):
        self._owner: dict[str, Outbox] = {}
        self._owned: dict[Outbox, set[str]] = {}
        self._num_unfinished: dict[str, int] = {}  # samples of the request still running

    def open(self) -> Outbox:
        outbox = Outbox()
        self._owned[outbox] = set()
        return outbox

    def close(self, outbox: Outbox) -> set[str]:
        request_ids = self._owned.pop(outbox, set())
        for request_id in request_ids:
            del self._owner[request_id]
            del self._num_unfinished[request_id]
        return request_ids

    def bind(self, request_id: str, outbox: Outbox, num_samples: int = 1) -> None:
        self._owner[request_id] = outbox
        self._owned[outbox].add(request_id)
        self._num_unfinished[request_id] = num_samples

    def owns(self, outbox: Outbox, request_id: str) -> bool:
        return self._owner.get(request_id) is outbox

    def publish(self, updates: list[RequestUpdate]) -> None:
        by_outbox: dict[Outbox, list[RequestUpdate]] = defaultdict(list)
        for update in updates:
            outbox = self._owner.get(update.request_id)
            if outbox is not None:
                by_outbox[outbox].append(update)
            if update.finished and outbox is not None:
                self._num_unfinished[update.request_id] -= 1
                if not self._num_unfinished[update.request_id]:
                    del self._owner[update.request_id], self._num_unfinished[update.request_id]
                    self._owned[outbox].discard(update.request_id)
        for outbox, group in by_outbox.items():
            outbox.put(step_update_to_pb(group))

    def fail_all(self, error: SluiceError) -> None:
        """Ends every request with the error's status, each router's in one message."""
        for outbox, request_ids in self._owned.items():
            if request_ids:
                self.reject(outbox, request_ids, error)
            request_ids.clear()
        self._owner.clear()
        self._num_unfinished.clear()

    @staticmethod
    def reject(outbox: Outbox, request_ids: Iterable[str], error: SluiceError) -> None:
        status_code = status_for(error).value[0]
        outbox.put(pb.StepUpdate(rejections=[pb.Rejection(request_id=request_id, status_code=status_code,
                                                          message=str(error)) for request_id in request_ids]))
