"""The router's pairing of a prefill and a decode pool, over stand-ins for the two SchedulerPools: the prefill leg
asks for do_remote_decode and its output is dropped; the decode leg carries the params it returned; a first token
that ends the request is the answer; a client that leaves between the legs ends the lease at once; an abort reaches
the leg in flight."""
import asyncio

from sluice.core.finish_reason import FinishReason
from sluice.core.kv_transfer import KvTransferParams
from sluice.core.sampling_params import SamplingParams
from sluice.router.schedulers.disaggregated_pool import DisaggregatedPool
from sluice.router.schedulers.messages import Finished, Submission, Tokens, Usage

LEASE = KvTransferParams(do_remote_prefill=True, remote_host="prefill", remote_port=1, remote_block_ids=[4, 2],
                         remote_request_id="r")
USAGE = Usage(3, 1, 0)


class LeaseLink:
    def __init__(self):
        self.released: list[str] = []

    async def release_kv(self, request_id: str) -> None:
        self.released.append(request_id)


class StandInPool:
    """SchedulerPool's face: each leg's events come from a queue the test feeds."""

    def __init__(self):
        self.links, self.on_ready, self.ready = [], None, True
        self.legs: dict[str, tuple[Submission, asyncio.Queue]] = {}
        self.finished: list[str] = []
        self.link = LeaseLink()

    def submit(self, submission: Submission) -> asyncio.Queue:
        self.legs[submission.request_id] = (submission, asyncio.Queue())
        return self.legs[submission.request_id][1]

    def owner(self, request_id: str) -> LeaseLink:
        return self.link

    def finish(self, request_id: str, reason: FinishReason, index=None) -> bool:
        self.finished.append(request_id)
        return True

    def release(self, request_id: str) -> None:
        pass


def _pair():
    prefill, decode = StandInPool(), StandInPool()
    return DisaggregatedPool(prefill, decode), prefill, decode


def _submission(max_tokens: int = 8) -> Submission:
    return Submission("r", [1, 2, 3], SamplingParams(max_tokens=max_tokens, temperature=0.0))


async def _drain(events: asyncio.Queue) -> list:
    await asyncio.sleep(0.01)
    found = []
    while not events.empty():
        found.append(events.get_nowait())
    return found


def test_the_decode_leg_carries_the_prefill_legs_params_and_only_its_output_reaches_the_client():
    async def run():
        pool, prefill, decode = _pair()
        events = pool.submit(_submission())
        submitted, prefill_events = prefill.legs["r"]
        assert submitted.kv_transfer == KvTransferParams(do_remote_decode=True)
        prefill_events.put_nowait(Tokens(0, [7]))
        prefill_events.put_nowait(Finished(0, FinishReason.LENGTH, USAGE, LEASE))
        await asyncio.sleep(0.01)
        submitted, decode_events = decode.legs["r"]
        assert submitted.kv_transfer == LEASE and submitted.prompt_token_ids == [1, 2, 3]
        decode_events.put_nowait(Tokens(0, [7, 8]))
        assert [event.token_ids for event in await _drain(events)] == [[7, 8]]
        pool.finish("r", FinishReason.ABORT)
        assert decode.finished == ["r"] and prefill.finished == []
        pool.release("r")
    asyncio.run(run())


def test_a_first_token_that_ends_the_request_is_its_answer():
    async def run():
        pool, prefill, decode = _pair()
        events = pool.submit(_submission())
        prefill_events = prefill.legs["r"][1]
        prefill_events.put_nowait(Tokens(0, [0]))
        prefill_events.put_nowait(Finished(0, FinishReason.STOP, USAGE))
        assert [type(event) for event in await _drain(events)] == [Tokens, Finished]
        assert not decode.legs
        pool.release("r")
    asyncio.run(run())


def test_a_client_that_leaves_between_the_legs_ends_the_lease():
    async def run():
        pool, prefill, decode = _pair()
        pool.submit(_submission())
        await asyncio.sleep(0)
        prefill.legs["r"][1].put_nowait(Finished(0, FinishReason.LENGTH, USAGE, LEASE))
        pool.release("r")  # before the pairing reads the prefill leg's end
        await asyncio.sleep(0.01)
        assert prefill.link.released == ["r"] and not decode.legs
    asyncio.run(run())


def test_a_one_token_request_is_the_prefill_pools_whole():
    async def run():
        pool, prefill, decode = _pair()
        pool.submit(_submission(max_tokens=1))
        assert prefill.legs["r"][0].kv_transfer is None and not decode.legs
        pool.release("r")
    asyncio.run(run())
