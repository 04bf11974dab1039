"""A router's outbox: updates pass one by one without credit, and merge while a crediting router is behind."""
import asyncio

import pytest

from sluice.scheduler.routers.outbox import Outbox
from sluice.v1 import scheduler_pb2 as pb


def _update(request_id: str, token_id: int) -> pb.StepUpdate:
    return pb.StepUpdate(request_ids=[request_id], sample_indices=[0], token_counts=[1], token_ids=[token_id])


def test_without_credit_each_update_is_its_own_message():
    async def scenario():
        outbox = Outbox()
        for token_id in (5, 6, 7):
            outbox.put(_update("a", token_id))
        return [list((await outbox.get()).step.token_ids) for _ in range(3)]

    assert asyncio.run(scenario()) == [[5], [6], [7]]


def test_updates_waiting_for_credit_go_out_merged_in_step_order():
    async def scenario():
        outbox = Outbox()
        outbox.grant(1)
        outbox.put(_update("a", 5))
        first = await outbox.get()
        outbox.put(_update("a", 6))
        outbox.put(_update("b", 9))
        outbox.put(pb.StepUpdate(finished=[pb.Finished(request_id="a")]))
        outbox.put(_update("b", 10))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(outbox.get(), 0.05)
        outbox.grant(1)
        return first, await outbox.get()

    first, merged = asyncio.run(scenario())
    assert list(first.step.token_ids) == [5]
    assert list(merged.step.request_ids) == ["a", "b", "b"]
    assert list(merged.step.token_ids) == [6, 9, 10]
    assert [f.request_id for f in merged.step.finished] == ["a"]
