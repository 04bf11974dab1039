"""A replica of a disaggregated pair stopped or killed in the middle of a request, through the real services on the
CPU with real NIXL: a prefill worker stopped while the decode replica reads its blocks fails the request with
UNAVAILABLE at --kv-pull-timeout, one killed then fails it at once, and the decode replica serves on with the prefill
worker started again; a decode worker killed during the pull fails the request and ends the lease at once; a decode
replica killed before it pulls fails the request with UNAVAILABLE, and the prefill replica's blocks come back when the
lease expires. Each test kills processes of its own pair of a tiny model's replicas."""
import os
import signal
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.pd_services import running_pd_services, wait_for
from tests.e2e.served_greedy import MAX_NEW_TOKENS, token_request
from tests.e2e.services import generate_once_served, wait_for_health

pytestmark = pytest.mark.slow

LEASE_SECONDS, PULL_SECONDS = 8.0, 6.0
AT_ONCE = 3.0  # seconds: well inside either timeout, on a loaded machine too
SCHEDULER_ARGS = ["--num-blocks", "64", "--block-size", "16", "--kv-lease-timeout", str(LEASE_SECONDS),
                  "--kv-pull-timeout", str(PULL_SECONDS)]
PROMPTS = [[3 + i] * 70 + [i] for i in range(4)]  # four full blocks each, no block shared


@pytest.fixture
def pair(tiny_qwen3):
    """The replicas' NIXL reads go over TCP, as between hosts without RDMA: a prefill worker's agent answers them, so
    one that is stopped holds them."""
    with running_pd_services(tiny_qwen3, SCHEDULER_ARGS, router_args=["--no-tokenizer"],
                             env={**os.environ, "UCX_TLS": "tcp"}) as services:
        yield services


def test_a_prefill_worker_that_hangs_or_dies_during_the_pull_fails_the_request_and_the_decode_replica_serves_on(
        pair, tiny_qwen3):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    warm, hung, killed, after = PROMPTS
    assert pair.client.generate(token_request(warm)).token_ids == hf_greedy(hf, warm, MAX_NEW_TOKENS)
    with ThreadPoolExecutor(1) as pool:
        answer, reading = _pull_from_a_stopped_prefill_worker(pair, pool, hung)
        with pytest.raises(grpc.RpcError) as timed_out:
            answer.result(timeout=PULL_SECONDS + 5)
        assert PULL_SECONDS - 1 < time.monotonic() - reading < PULL_SECONDS + AT_ONCE  # the pull's deadline
        pair.prefill_worker.send_signal(signal.SIGCONT)
        answer, reading = _pull_from_a_stopped_prefill_worker(pair, pool, killed)
        pair.prefill_worker.send_signal(signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as disconnected:
            answer.result(timeout=PULL_SECONDS + 5)
        assert time.monotonic() - reading < AT_ONCE  # NIXL reports the broken peer before the deadline
    assert timed_out.value.code() == disconnected.value.code() == grpc.StatusCode.UNAVAILABLE
    pair.prefill_worker.wait()
    load = pair.load("decode")
    assert load.num_free_blocks == load.num_total_blocks and not load.num_running
    assert pair.metric("decode", "sluice:kv_transfer_failures_total") == 2
    wait_for_health(pair.addresses["decode"], "sluice.v1.Scheduler", health_pb2.HealthCheckResponse.SERVING, 1)

    pair.prefill_worker = pair.restart(pair.prefill_worker)
    pulled = pair.metric("decode", "sluice:kv_transfer_seconds_count")
    assert generate_once_served(pair.client, token_request(after), 60) == hf_greedy(hf, after, MAX_NEW_TOKENS)
    assert pair.metric("decode", "sluice:kv_transfer_seconds_count") == pulled + 1
    pair.wait_until_settled()


def test_a_decode_worker_killed_during_the_pull_ends_the_lease_and_a_decode_replica_killed_before_leaves_it_to_expire(
        pair):
    prefill = pair.load("prefill")
    with ThreadPoolExecutor(1) as pool:
        with pair.decode_worker_stopped():
            answer = pool.submit(pair.client.generate, token_request(PROMPTS[0]))
            pair.wait_until_pulling()
            pair.decode_worker.send_signal(signal.SIGKILL)
            killed = time.monotonic()
        with pytest.raises(grpc.RpcError) as lost:
            answer.result(timeout=5)
        assert time.monotonic() - killed < AT_ONCE
        wait_for(lambda: pair.metric("prefill", "sluice:kv_leases") == 0, timeout=AT_ONCE)  # ended at once
        pair.decode_worker.wait()
        pair.decode_worker = pair.restart(pair.decode_worker)
        generate_once_served(pair.client, token_request(PROMPTS[2]), 60)
        pair.wait_until_settled()

        expired = pair.metric("prefill", "sluice:kv_leases_expired_total")
        pair.decode_scheduler.send_signal(signal.SIGSTOP)  # the decode leg waits unread
        answer = pool.submit(pair.client.generate, token_request(PROMPTS[1]))
        wait_for(lambda: pair.metric("prefill", "sluice:kv_leases") == 1)
        leased = time.monotonic()
        for process in (pair.decode_scheduler, pair.decode_worker):
            process.send_signal(signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as gone:
            answer.result(timeout=5)
    assert lost.value.code() == gone.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - leased < AT_ONCE
    assert pair.load("prefill").num_free_blocks < prefill.num_total_blocks
    wait_for(lambda: pair.metric("prefill", "sluice:kv_leases") == 0, timeout=LEASE_SECONDS + AT_ONCE)
    assert time.monotonic() - leased > LEASE_SECONDS - 0.5
    assert pair.metric("prefill", "sluice:kv_leases_expired_total") == expired + 1
    load = pair.load("prefill")
    assert load.num_free_blocks == load.num_total_blocks and not load.num_running


def _pull_from_a_stopped_prefill_worker(pair, pool: ThreadPoolExecutor, prompt: list[int]) -> tuple[Future, float]:
    """The answer to a request whose pull reads from the prefill worker, stopped (SIGSTOP) meanwhile; and when the
    read began, about."""
    with pair.decode_worker_stopped():
        answer = pool.submit(pair.client.generate, token_request(prompt))
        pair.wait_until_pulling()
        pair.prefill_worker.send_signal(signal.SIGSTOP)
    reading = time.monotonic()
    time.sleep(0.5)  # the woken decode worker posts its read
    assert pair.metric("decode", "sluice:kv_pulls") == 1
    return answer, reading
