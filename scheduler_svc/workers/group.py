"""The scheduler's end of one model replica: its ranks' workers, each step serialised once for all."""
import asyncio

from sluice.core.errors import InvalidArgument
from sluice.core.kv_transfer import KvSource
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.core.step_plan_pb import plan_to_pb
from sluice.scheduler.workers.client import WorkerClient


class WorkerGroup:
    """The scheduler's end of one model replica: its ranks' workers, in rank order (the tensor-parallel ranks of each
    pipeline stage in turn; one worker when the replica is not sharded). Each step is serialised once and the same
    bytes go to every rank; the driver, the first rank of the last stage, answers with the outcome and the others
    with completion markers. Losing any rank loses the replica: every failure surfaces as Unavailable, as soon as
    any rank's stream ends."""

    def __init__(self, workers: list[WorkerClient]):
        self.workers = workers
        self._take_driver(0)

    def _take_driver(self, rank: int) -> None:
        self.driver, self.followers = self.workers[rank], self.workers[:rank] + self.workers[rank + 1:]

    @property
    def address(self) -> str:
        return ",".join(worker.address for worker in self.workers)

    @property
    def streaming(self) -> bool:
        return all(worker.streaming for worker in self.workers)

    async def get_info(self, timeout: float):
        """Waits until every rank serves; checks that they serve one model as the ranks of one group."""
        infos = await _on_every_rank(worker.get_info(timeout) for worker in self.workers)
        for rank, (worker, info) in enumerate(zip(self.workers, infos)):
            if (info.rank, info.world_size) != (rank, len(self.workers)):
                raise RuntimeError(f"the worker at {worker.address} is rank {info.rank} of {info.world_size}, not "
                                   f"rank {rank} of {len(self.workers)}: list the workers in rank order")
            if _without_rank(info) != _without_rank(infos[0]):
                raise RuntimeError(f"the worker at {worker.address} serves {info}, rank 0 serves {infos[0]}")
        num_stages = infos[0].pipeline_parallel_size or 1
        self._take_driver(len(self.workers) - len(self.workers) // num_stages)
        return infos[0]

    async def start(self, cache) -> int:
        """Sets up every rank's KV cache at once (the ranks profile and agree together) and opens their streams.
        Returns the number of KV blocks that every rank holds."""
        return min(await _on_every_rank(worker.start(cache) for worker in self.workers))

    @property
    def kv_sources(self) -> list[KvSource]:
        """Each rank's KV source, in rank order (workers of kv_role prefill or decode)."""
        return [worker.kv_source for worker in self.workers]

    @property
    def kv_engine_id(self) -> str:
        """Names the ranks' KV caches as they are set up now: a rank set up again is a new NIXL agent."""
        return ",".join(source.agent_name for source in self.kv_sources if source is not None)

    async def pull_kv(self, sources: list[KvSource], remote_block_ids: list[int], local_block_ids: list[int],
                      timeout: float) -> int:
        """Every rank reads the blocks of the prefill rank of its own rank at once; returns the bytes read."""
        if len(sources) != len(self.workers):
            raise InvalidArgument("kv_transfer.remote_engine_id", f"the prefill replica has {len(sources)} "
                                  f"tensor-parallel ranks, this one {len(self.workers)}")
        return sum(await _on_every_rank(worker.pull_kv(source, remote_block_ids, local_block_ids, timeout)
                                        for worker, source in zip(self.workers, sources)))

    async def restart(self) -> None:
        await _on_every_rank(worker.restart() for worker in self.workers)

    def send(self, plan: StepPlan) -> None:
        step = plan_to_pb(plan).SerializeToString()
        for worker in self.workers:
            worker.send(step)

    async def receive(self) -> StepOutcome:
        if not self.followers:
            return await self.driver.receive()
        reads = [asyncio.ensure_future(self.driver.receive()),
                 *(asyncio.ensure_future(worker.receive_marker()) for worker in self.followers)]
        try:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for read in reads:  # a rank failed, or the step is overdue: the others' reads would wait on a broken group
                read.cancel()
        for read in done:
            if read.exception() is not None:
                raise read.exception()
        return reads[0].result()

    def abandon(self) -> None:
        """Ends every rank's Execute stream: the group is taken for lost, and a rank that is stuck or stopped finds
        its stream cancelled once it runs again."""
        for worker in self.workers:
            worker.abandon()

    async def check_streaming(self) -> None:
        for worker in self.workers:
            await worker.check_streaming()

    async def close(self) -> None:
        for worker in self.workers:
            await worker.close()


def _without_rank(info):
    copy = type(info)()
    copy.CopyFrom(info)
    copy.ClearField("rank")
    return copy


async def _on_every_rank(calls) -> list:
    """The calls' results, run at once; the first failure cancels the others."""
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
