"""n > 1: a request becomes n sample requests. Sample 0 prefills the prompt short of its last token; the others then
fork its KV (full blocks shared, the partial last block copied) and all n compute the last prompt token and sample
on their own from there."""
from dataclasses import replace

from sluice.scheduler.request import Request, RequestStatus


def sample_request_id(request_id: str, index: int) -> str:
    return f"{request_id}#{index}"


def split_samples(request: Request) -> list[Request]:
    """The n samples of a request; sample i's seed is seed + i, and only sample 0 computes prompt logprobs."""
    params = request.sampling_params
    return [
        Request(
            request_id=sample_request_id(request.request_id, i),
            prompt_token_ids=request.prompt_token_ids,
            sampling_params=replace(params, seed=None if params.seed is None else (params.seed + i) % 2**64,
                                    prompt_logprobs=params.prompt_logprobs if i == 0 else None),
            priority=request.priority, arrival_time=request.arrival_time, cache_salt=request.cache_salt,
            deadline=request.deadline, group_id=request.request_id, sample_index=i, images=request.images,
        )
        for i in range(params.n)
    ]


class SampleGroups:
    """The samples of n > 1 requests: which are unfinished, and which still wait to fork sample 0's prompt."""

    def __init__(self):
        self._unfinished: dict[str, list[Request]] = {}  # client request id -> its unfinished samples
        self._waiting_to_fork: dict[str, tuple[Request, list[Request]]] = {}  # sample 0's id -> (it, the others)
        self._parent_of: dict[str, Request] = {}  # a sample waiting to fork -> sample 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._unfinished

    def add(self, samples: list[Request]) -> None:
        parent, children = samples[0], samples[1:]
        self._unfinished[parent.client_request_id] = list(samples)
        self._waiting_to_fork[parent.request_id] = (parent, list(children))
        self._parent_of.update((child.request_id, parent) for child in children)

    def unfinished(self, request_id: str) -> list[Request]:
        return list(self._unfinished.get(request_id, ()))

    def num_held_back(self, request: Request) -> int:
        """Sample 0 stops short of its last prompt token until the other samples fork its prompt."""
        return int(request.request_id in self._waiting_to_fork and request.num_prompt_tokens > 1)

    def take_ready(self) -> list[tuple[Request, list[Request]]]:
        """Each running sample 0 whose prompt, short of the last token, is computed, with the samples to fork."""
        ready = [(parent, children) for parent, children in self._waiting_to_fork.values()
                 if parent.status is RequestStatus.RUNNING
                 and parent.num_computed_tokens >= parent.num_prompt_tokens - 1]
        for parent, children in ready:
            del self._waiting_to_fork[parent.request_id]
            for child in children:
                del self._parent_of[child.request_id]
        return ready

    def forget(self, request: Request) -> list[Request]:
        """Drops a finished sample; returns the samples that waited to fork it and must now prefill on their own."""
        parent = self._parent_of.pop(request.request_id, None)
        if parent is not None:
            siblings = self._waiting_to_fork[parent.request_id][1]
            siblings.remove(request)
            if not siblings:
                del self._waiting_to_fork[parent.request_id]
        _, orphans = self._waiting_to_fork.pop(request.request_id, (None, []))
        for orphan in orphans:
            del self._parent_of[orphan.request_id]
        group = self._unfinished.get(request.client_request_id)
        if group is not None:
            group.remove(request)
            if not group:
                del self._unfinished[request.client_request_id]
        return orphans
