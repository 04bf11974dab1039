"""Balances one router's requests over several scheduler replicas (one replica per model copy)."""
import asyncio
import hashlib
from collections.abc import Awaitable, Callable

from sluice.core.errors import InvalidArgument, Unavailable, Unimplemented
from sluice.core.finish_reason import FinishReason
from sluice.router.schedulers.link import SchedulerLink
from sluice.router.schedulers.messages import Event, Submission

AFFINITY_PREFIX_TOKENS = 256  # requests that share this many leading tokens prefer the same replica
LOAD_SLACK = 4  # a replica this many requests above the least loaded one loses its prefix affinity


class SchedulerPool:
    """Picks a replica per request: among the ready replicas within LOAD_SLACK of the least loaded, the one that
    rendezvous hashing assigns the prompt's prefix, so shared prefixes meet the same prefix cache. Ready while any
    replica is ready (connected, and its scheduler has its worker)."""

    def __init__(self, addresses: list[str], on_ready: Callable[[bool], Awaitable[None]] | None = None):
        self.links = [SchedulerLink(address, self._link_changed) for address in addresses]
        self.on_ready = on_ready
        self._owner: dict[str, SchedulerLink] = {}

    @property
    def ready(self) -> bool:
        return any(link.ready for link in self.links)

    async def model_info(self, timeout: float):
        """The served model as every replica describes it (the shortest context where they differ)."""
        infos = await asyncio.gather(*(link.model_info(timeout) for link in self.links))
        if len({(info.model, info.vocab_size) for info in infos}) > 1:
            raise ValueError("the schedulers serve different models")
        return min(infos, key=lambda info: info.max_model_len)

    async def loads(self, timeout: float) -> list:
        """The Load of every ready replica."""
        return await asyncio.gather(*(link.load(timeout) for link in self.links if link.ready))

    @property
    def num_in_flight(self) -> int:
        return sum(link.num_in_flight for link in self.links)

    def kv_events(self, after_sequence_number: int, load_before_first_batch: bool):
        """The prefix-cache events and load of the one replica; Unimplemented for several, whose caches a gateway
        cannot tell apart behind this router (which sends shared prefixes to one replica itself)."""
        if len(self.links) > 1:
            raise Unimplemented("this router balances several scheduler replicas: their KV events are not relayed")
        return self.links[0].kv_events(after_sequence_number, load_before_first_batch)

    def start(self) -> None:
        for link in self.links:
            link.start()

    def submit(self, submission: Submission) -> asyncio.Queue[Event]:
        if submission.request_id in self._owner:
            raise InvalidArgument("request_id", f"{submission.request_id!r} duplicates a request in flight")
        return self._submit_to(self.pick(submission.prompt_token_ids), submission)

    def submit_elsewhere(self, submission: Submission) -> asyncio.Queue[Event]:
        """Submits again, on another ready replica, a request whose replica failed it before any of its output
        reached the client; Unavailable if there is none."""
        failed = self._owner.pop(submission.request_id)
        failed.release(submission.request_id)
        return self._submit_to(self.pick(submission.prompt_token_ids, excluded=failed), submission)

    def _submit_to(self, link: SchedulerLink, submission: Submission) -> asyncio.Queue[Event]:
        events = link.submit(submission)
        self._owner[submission.request_id] = link
        return events

    def pick(self, prompt_token_ids: list[int], excluded: SchedulerLink | None = None) -> SchedulerLink:
        ready = [link for link in self.links if link.ready and link is not excluded]
        if not ready:
            raise Unavailable("no scheduler is ready")
        least = min(link.num_in_flight for link in ready)
        eligible = [link for link in ready if link.num_in_flight <= least + LOAD_SLACK]
        prefix = ",".join(map(str, prompt_token_ids[:AFFINITY_PREFIX_TOKENS])).encode()
        return max(eligible, key=lambda link: hashlib.blake2b(prefix + link.address.encode(), digest_size=8).digest())

    def finish(self, request_id: str, reason: FinishReason, index: int | None = None) -> bool:
        link = self._owner.get(request_id)
        return link is not None and link.finish(request_id, reason, index)

    def owner(self, request_id: str) -> SchedulerLink | None:
        return self._owner.get(request_id)

    def release(self, request_id: str) -> None:
        link = self._owner.pop(request_id, None)
        if link is not None:
            link.release(request_id)

    async def _link_changed(self, connected: bool) -> None:
        if self.on_ready is not None:
            await self.on_ready(self.ready)

    async def close(self) -> None:
        await asyncio.gather(*(link.close() for link in self.links))
