"""The waiting queue, in the order the policy admits requests. Removal is lazy (O(1)): an aborted request stays in
the underlying structure, skipped when it reaches the front."""
import heapq
import itertools
from collections import deque

from scheduler_svc.request import Request


class WaitingQueue:
    def __init__(self):
        self._live: dict[str, Request] = {}
        self.num_tokens = 0  # tokens of the live waiting requests, for admission bounds

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __contains__(self, request: Request) -> bool:
        return self._live.get(request.request_id) is request

    def push(self, request: Request) -> None:
        self._track(request)
        self._push(request)

    def push_front(self, request: Request) -> None:
        """Requeues a preempted request ahead of the requests that arrived after it."""
        self._track(request)
        self._push_front(request)

    def peek(self) -> Request | None:
        self._drop_removed()
        return self._front()

    def pop(self) -> Request:
        self._drop_removed()
        request = self._pop()
        self._untrack(request)
        return request

    def remove(self, request: Request) -> None:
        if request in self:
            self._untrack(request)

    def _track(self, request: Request) -> None:
        self._live[request.request_id] = request
        self.num_tokens += request.num_tokens

    def _untrack(self, request: Request) -> None:
        del self._live[request.request_id]
        self.num_tokens -= request.num_tokens

    def _drop_removed(self) -> None:
        while (front := self._front()) is not None and front not in self:
            self._pop()

    def _push(self, request: Request) -> None:
        raise NotImplementedError

    def _push_front(self, request: Request) -> None:
        raise NotImplementedError

    def _front(self) -> Request | None:
        raise NotImplementedError

    def _pop(self) -> Request:
        raise NotImplementedError


class FcfsQueue(WaitingQueue):
    def __init__(self):
        super().__init__()
        self._queue: deque[Request] = deque()

    def _push(self, request: Request) -> None:
        self._queue.append(request)

    def _push_front(self, request: Request) -> None:
        self._queue.appendleft(request)

    def _front(self) -> Request | None:
        return self._queue[0] if self._queue else None

    def _pop(self) -> Request:
        return self._queue.popleft()


class PriorityQueue(WaitingQueue):
    """Lower priority value first, then earlier arrival. A preempted request keeps its key, so it goes back ahead of
    every waiting request of its priority that arrived after it."""

    def __init__(self):
        super().__init__()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def _push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_time, next(self._counter), request))

    _push_front = _push

    def _front(self) -> Request | None:
        return self._heap[0][3] if self._heap else None

    def _pop(self) -> Request:
        return heapq.heappop(self._heap)[3]


def make_waiting_queue(policy: str) -> WaitingQueue:
    return PriorityQueue() if policy == "priority" else FcfsQueue()


def running_order_key(policy: str):
    """Sort key of the running list: its last request is the one preemption takes first."""
    if policy == "priority":
        return lambda request: (request.priority, request.arrival_time)
    return lambda request: request.arrival_time
