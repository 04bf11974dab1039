"""The waiting queue and the running order, both sorted by the scheduling policy's key."""
import heapq
import itertools
from collections.abc import Callable

from sluice.scheduler.request import Request


def policy_key(policy: str) -> Callable[[Request], tuple]:
    """Sort key of a policy: under "priority" lower value first, then earlier arrival; under "fcfs" arrival only."""
    if policy == "priority":
        return lambda request: (request.priority, request.arrival_time)
    return lambda request: (request.arrival_time,)


class WaitingQueue:
    """A heap on the policy key. A preempted request keeps its key, so it goes back ahead of every waiting request
    that arrived after it (under "fcfs", at the front). Removal is lazy and O(1): a removed request stays in the heap
    and is skipped when it reaches the top, or dropped when removed entries outnumber live ones."""

    def __init__(self, policy: str):
        self._key = policy_key(policy)
        self._heap: list[tuple[tuple, int, Request]] = []
        self._counter = itertools.count()
        self._live: dict[str, Request] = {}
        self.num_tokens = 0  # tokens of the live waiting requests, for admission bounds

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __contains__(self, request: Request) -> bool:
        return self._live.get(request.request_id) is request

    def push(self, request: Request) -> None:
        self._live[request.request_id] = request
        self.num_tokens += request.num_tokens
        heapq.heappush(self._heap, (self._key(request), next(self._counter), request))

    def peek(self) -> Request | None:
        while self._heap and self._heap[0][2] not in self:
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Request:
        request = self.peek()
        if request is None:
            raise IndexError("pop from an empty waiting queue")
        heapq.heappop(self._heap)
        self.remove(request)
        return request

    def remove(self, request: Request) -> None:
        if request in self:
            del self._live[request.request_id]
            self.num_tokens -= request.num_tokens
            if len(self._heap) > 2 * len(self._live) + 64:
                self._heap = [entry for entry in self._heap if entry[2] in self]
                heapq.heapify(self._heap)
