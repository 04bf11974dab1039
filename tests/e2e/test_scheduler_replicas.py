"""One router balancing over two scheduler replicas (each with its own worker): requests spread over both, shared
prefixes meet one prefix cache, and the router fails over: a replica that lost its worker or its scheduler gets no
new requests, and one it failed before any output is retried on the other."""
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sluice.client import SluiceClient, text_request
from tests.e2e.services import extra_router, health_status, running_services, wait_for_health

pytestmark = pytest.mark.slow

PROMPTS = [f"Write a long story about a {animal}." for animal in ("cat", "dog", "owl", "fox", "eel", "yak", "emu",
                                                                   "ant")]
MAX_TOKENS = 24
CLIENTS = 4
SETTLED_AFTER_KILL = 5.0  # requests started this long after the kill must (nearly) all succeed
LOAD_AFTER_KILL = 10.0
STEP_TIMEOUT = 2.0  # replica a's


def _long(prompt: str):
    return text_request(prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def replicas(default_model_dir, services):
    """Replica a of its own, replica b the session's stack, and a router over both."""
    with running_services(default_model_dir, ["--step-timeout", str(STEP_TIMEOUT)]) as a:
        schedulers = f"{a.layout.scheduler_address},{services.layout.scheduler_address}"
        with extra_router(a, default_model_dir, schedulers=schedulers) as (_, address), SluiceClient(address) as client:
            yield a, services, client, address


def test_requests_spread_over_replicas_and_shared_prefixes_meet(replicas):
    a, b, client, _ = replicas
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = [pool.submit(client.generate, _long(p)) for p in PROMPTS]
        busy = set()
        while not all(r.done() for r in results):
            busy |= {name for name, s in (("a", a), ("b", b)) if s.load().num_running > 0}
            time.sleep(0.02)
    assert busy == {"a", "b"}
    assert all(len(r.result().token_ids) == MAX_TOKENS for r in results)

    repeated = "You are a careful assistant. " * 12 + "Name a prime number."
    client.generate(text_request(repeated, max_tokens=2, temperature=0.0))
    again = client.generate(text_request(repeated, max_tokens=2, temperature=0.0))
    assert again.usage["cached_tokens"] > 0  # the same prefix went to the same replica's prefix cache


def test_requests_a_wedged_replica_held_are_retried_on_the_other(replicas):
    a, _, client, _ = replicas
    worker = a.processes[0]
    worker.send_signal(signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            timed = list(pool.map(lambda prompt: _timed(client, _long(prompt)), PROMPTS))
    finally:
        worker.send_signal(signal.SIGCONT)
    assert [len(result.token_ids) for result, _ in timed] == [MAX_TOKENS] * len(PROMPTS)
    assert max(seconds for _, seconds in timed) > STEP_TIMEOUT  # those sent to a waited for its step timeout
    wait_for_health(a.layout.scheduler_address, "sluice.v1.Scheduler", health_pb2.HealthCheckResponse.SERVING, 30)


def _timed(client: SluiceClient, request):
    started = time.monotonic()
    result = client.generate(request, timeout=60)
    return result, time.monotonic() - started


def _steady_load(client: SluiceClient, until: float, outcomes: list) -> None:
    """Requests one after another until `until`: (start time, status code) of each."""
    for i in range(1000):
        started = time.monotonic()
        if started >= until:
            return
        try:
            client.generate(text_request(PROMPTS[i % len(PROMPTS)], max_tokens=8, temperature=0.0, ignore_eos=True),
                            timeout=60)
            outcomes.append((started, grpc.StatusCode.OK))
        except grpc.RpcError as error:
            outcomes.append((started, error.code()))


def test_a_replica_that_lost_its_worker_is_failed_over(replicas):
    a, b, client, address = replicas
    killed = time.monotonic() + 2.0
    outcomes = []
    clients = [threading.Thread(target=_steady_load, args=(client, killed + LOAD_AFTER_KILL, outcomes))
               for _ in range(CLIENTS)]
    for thread in clients:
        thread.start()
    time.sleep(killed - time.monotonic())
    worker = a.processes[0]
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    dead = time.monotonic()
    for thread in clients:
        thread.join(timeout=LOAD_AFTER_KILL + 90)
    assert not any(thread.is_alive() for thread in clients), "a request hung"
    assert grpc.StatusCode.DEADLINE_EXCEEDED not in [code for _, code in outcomes]
    after_death = [code for started, code in outcomes if started > dead]
    assert after_death.count(grpc.StatusCode.OK) == len(after_death), outcomes  # sent to a, then retried on b
    settled = [code for started, code in outcomes if started >= killed + SETTLED_AFTER_KILL]
    assert len(settled) >= 2 * CLIENTS and settled.count(grpc.StatusCode.OK) >= 0.95 * len(settled), outcomes
    assert health_status(address, "sluice.v1.Generation") == health_pb2.HealthCheckResponse.SERVING

    a.processes[0] = subprocess.Popen(worker.args, env=a.env)
    wait_for_health(a.layout.scheduler_address, "sluice.v1.Scheduler", health_pb2.HealthCheckResponse.SERVING, 60)


def test_losing_a_replicas_scheduler_leaves_the_other_serving(replicas):
    a, _, client, _ = replicas
    a.processes[1].send_signal(signal.SIGKILL)
    a.processes[1].wait()
    time.sleep(1.0)  # the router sees the broken stream at once on loopback
    survivors = [client.generate(_long(p)) for p in PROMPTS[:2]]
    assert all(len(s.token_ids) == MAX_TOKENS for s in survivors)
