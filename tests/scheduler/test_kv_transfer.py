"""Prefill/decode disaggregation in the scheduler alone: a prefill leg ends at its first token with its prompt's full
blocks on lease (released, or expired on the scheduler's clock); a decode leg pins the blocks its prefix cache holds
and fresh ones for the rest, which (once the fake worker holds the prefill side's KV in them) its start takes as
prefix hits; every block comes back."""
import pytest

from sluice.core.errors import InvalidArgument
from sluice.core.finish_reason import FinishReason
from sluice.core.kv_transfer import KvTransferParams
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.scheduler import Scheduler
from tests.scheduler.sched_testkit import EOS, FakeWorker, make_request, make_scheduler, run_to_completion

PROMPT = list(range(1, 44))  # 2 full blocks of 16 and 11 tokens
PREFILL_LEG = KvTransferParams(do_remote_decode=True)
DECODE_LEG = KvTransferParams(do_remote_prefill=True, remote_host="prefill", remote_port=1, remote_request_id="p",
                              remote_block_ids=[5, 6])


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _leg(request_id: str, kv_transfer: KvTransferParams, prompt=PROMPT, max_tokens: int = 8):
    request = make_request(request_id, prompt, max_tokens)
    request.kv_transfer = kv_transfer
    return request


def test_a_prefill_leg_ends_at_its_first_token_and_holds_its_full_blocks_until_released():
    scheduler = make_scheduler(num_blocks=8, kv_role="prefill")
    scheduler.kv_leases.origin = KvTransferParams(remote_engine_id="e", remote_host="h", remote_port=7)
    scheduler.add_request(_leg("a", PREFILL_LEG))
    updates, _ = run_to_completion(scheduler, FakeWorker(block_size=16))
    (last,) = [update for update in updates if update.finished]
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 1
    table_blocks = last.kv_transfer.remote_block_ids
    assert last.kv_transfer == KvTransferParams(do_remote_prefill=True, remote_engine_id="e", remote_host="h",
                                                remote_port=7, remote_block_ids=table_blocks, remote_request_id="a")
    assert len(table_blocks) == 2 and scheduler.block_manager.num_free_blocks == 6
    assert scheduler.kv_leases.release("a") and not scheduler.kv_leases.release("a")
    assert scheduler.block_manager.num_free_blocks == 8


def test_a_lease_expires_on_the_schedulers_clock():
    clock = Clock()
    scheduler = Scheduler(SchedulerConfig(num_blocks=8, kv_role="prefill", kv_lease_timeout=5.0), {EOS}, clock)
    scheduler.add_request(_leg("a", PREFILL_LEG))
    run_to_completion(scheduler, FakeWorker(block_size=16))
    clock.now = 4.9
    scheduler.kv_leases.expire()
    assert len(scheduler.kv_leases) == 1
    clock.now = 5.0
    scheduler.kv_leases.expire()
    assert len(scheduler.kv_leases) == 0 and scheduler.kv_leases.num_expired == 1
    assert scheduler.block_manager.num_free_blocks == 8


def test_a_prefill_leg_that_ends_for_good_holds_nothing():
    scheduler = make_scheduler(num_blocks=8, kv_role="prefill")
    scheduler.add_request(_leg("a", PREFILL_LEG))
    updates, _ = run_to_completion(scheduler, FakeWorker(block_size=16, eos_probability=1.0))
    assert updates[-1].finish_reason is FinishReason.STOP and updates[-1].kv_transfer is None
    assert scheduler.block_manager.num_free_blocks == 8


def _pulled(scheduler, worker: FakeWorker, request_id: str, prompt=PROMPT):
    """Reserves a decode leg's pull and writes the prompt's tokens into the pulled blocks, as the pull does."""
    request = _leg(request_id, DECODE_LEG, prompt)
    plan = scheduler.block_manager.reserve_pull(request, len(DECODE_LEG.remote_block_ids))
    for i, block_id in enumerate(plan.block_ids, plan.first_block):
        worker.kv[block_id] = prompt[i * 16:(i + 1) * 16]
    scheduler.block_manager.cache_pulled(request)
    return request, plan


def test_a_decode_leg_starts_from_its_pulled_blocks_and_pulls_only_those_it_lacks():
    scheduler = make_scheduler(num_blocks=8, kv_role="decode")
    worker = FakeWorker(block_size=16)
    request, plan = _pulled(scheduler, worker, "a")
    assert plan.first_block == 0 and len(plan.block_ids) == 2
    assert scheduler.block_manager.num_free_blocks == 6  # pinned until the request starts
    scheduler.add_request(request)
    first_plan = scheduler.schedule()
    assert first_plan.new_requests[0].num_computed_tokens == 32 and first_plan.num_scheduled_tokens == {"a": 11}
    scheduler.update_from_outcome(first_plan, worker.execute(first_plan))
    run_to_completion(scheduler, worker)
    again, plan = _pulled(scheduler, worker, "b", PROMPT[:32] + [99] * 5)
    assert plan.first_block == 2 and plan.block_ids == []
    scheduler.block_manager.unpin(again)
    assert scheduler.block_manager.num_free_blocks == 8


def test_a_decode_leg_of_a_whole_block_prompt_computes_its_last_token():
    scheduler = make_scheduler(num_blocks=8, kv_role="decode")
    request, plan = _pulled(scheduler, FakeWorker(block_size=16), "a", PROMPT[:32])
    assert len(plan.block_ids) == 1  # the second block holds the last token, which the decode side computes
    scheduler.block_manager.unpin(request)
    assert scheduler.block_manager.num_free_blocks == 8


@pytest.mark.parametrize("role, leg, field", [("both", PREFILL_LEG, "kv_transfer.do_remote_decode"),
                                              ("decode", PREFILL_LEG, "kv_transfer.do_remote_decode"),
                                              ("prefill", DECODE_LEG, "kv_transfer.do_remote_prefill")])
def test_a_leg_the_replicas_role_does_not_take_is_refused_naming_the_field(role, leg, field):
    scheduler = make_scheduler(num_blocks=8, kv_role=role)
    with pytest.raises(InvalidArgument) as refused:
        scheduler.add_request(_leg("a", leg))
    assert refused.value.field == field


def test_a_decode_role_needs_prefix_caching():
    with pytest.raises(ValueError, match="prefix caching"):
        make_scheduler(kv_role="decode", enable_prefix_caching=False)
