"""A replica of a disaggregated pair killed in the middle of a request, through the real services on the CPU with real
NIXL: a prefill worker killed while the decode replica reads its blocks fails the request with UNAVAILABLE within
--kv-pull-timeout, and the decode replica serves on with the prefill worker started again; a decode replica killed
before it pulls fails the request with UNAVAILABLE at once, and the prefill replica's blocks come back when the lease
expires. Each test kills a replica of its own pair of a tiny model's replicas."""
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.pd_services import running_pd_services, wait_for
from tests.e2e.served_greedy import MAX_NEW_TOKENS, token_request
from tests.e2e.services import generate_once_served, wait_for_health

pytestmark = pytest.mark.slow

LEASE_SECONDS, PULL_SECONDS = 2.0, 3.0
SCHEDULER_ARGS = ["--num-blocks", "64", "--block-size", "16", "--kv-lease-timeout", str(LEASE_SECONDS),
                  "--kv-pull-timeout", str(PULL_SECONDS)]
PROMPTS = [[3 + i] * 70 + [i] for i in range(3)]  # four full blocks each, no block shared


@pytest.fixture
def pair(tiny_qwen3):
    """The replicas' NIXL reads go over TCP, as between hosts without RDMA: a prefill worker's agent answers them, so
    one that is stopped holds them."""
    with running_pd_services(tiny_qwen3, SCHEDULER_ARGS, router_args=["--no-tokenizer"],
                             env={**os.environ, "UCX_TLS": "tcp"}) as services:
        yield services


def test_a_prefill_worker_killed_during_the_pull_fails_the_request_and_the_decode_replica_serves_on(pair, tiny_qwen3):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    warm, doomed, after = PROMPTS
    assert pair.client.generate(token_request(warm)).token_ids == hf_greedy(hf, warm, MAX_NEW_TOKENS)
    pair.wait_until_settled()
    with ThreadPoolExecutor(1) as pool:
        with pair.decode_worker_stopped():
            answer = pool.submit(pair.client.generate, token_request(doomed))
            pair.wait_until_pulling()
            pair.prefill_worker.send_signal(signal.SIGSTOP)  # its NIXL agent answers no read from now on
        time.sleep(0.5)  # the woken decode worker posts its read
        assert pair.metric("decode", "sluice:kv_pulls") == 1
        pair.prefill_worker.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(grpc.RpcError) as failure:
            answer.result(timeout=2 * PULL_SECONDS + 5)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - killed < PULL_SECONDS + 1
    pair.prefill_worker.wait()
    load = pair.load("decode")
    assert load.num_free_blocks == load.num_total_blocks and not load.num_running
    assert pair.metric("decode", "sluice:kv_transfer_failures_total") == 1
    wait_for_health(pair.addresses["decode"], "sluice.v1.Scheduler", health_pb2.HealthCheckResponse.SERVING, 1)

    pair.restart_prefill_worker()
    pulled = pair.metric("decode", "sluice:kv_transfer_seconds_count")
    assert generate_once_served(pair.client, token_request(after), 60) == hf_greedy(hf, after, MAX_NEW_TOKENS)
    assert pair.metric("decode", "sluice:kv_transfer_seconds_count") == pulled + 1
    pair.wait_until_settled()


def test_a_decode_replica_killed_before_it_pulls_leaves_the_prefill_blocks_to_the_lease(pair):
    prefill = pair.load("prefill")
    with ThreadPoolExecutor(1) as pool:
        pair.decode_scheduler.send_signal(signal.SIGSTOP)  # the decode leg waits unread
        answer = pool.submit(pair.client.generate, token_request(PROMPTS[0]))
        wait_for(lambda: pair.metric("prefill", "sluice:kv_leases") == 1)
        leased = time.monotonic()
        for process in (pair.decode_scheduler, pair.decode_worker):
            process.send_signal(signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as failure:
            answer.result(timeout=5)
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - leased < 2
    assert pair.load("prefill").num_free_blocks < prefill.num_total_blocks
    wait_for(lambda: pair.metric("prefill", "sluice:kv_leases") == 0, timeout=LEASE_SECONDS + 1)
    assert time.monotonic() - leased > LEASE_SECONDS - 0.5
    assert pair.metric("prefill", "sluice:kv_leases_expired_total") == 1
    load = pair.load("prefill")
    assert load.num_free_blocks == load.num_total_blocks and not load.num_running
