"""Prefill/decode disaggregation through the real services on the CPU, KV blocks moved by real NIXL between worker
processes: greedy tokens through a prefill and a decode replica are Hugging Face's and a single replica's, alone and
8 at once with prefix-cache hits on both sides, at -tp 1 and with both replicas at -tp 2; a client that leaves in
either leg or during the pull frees both sides' blocks; a lease no decode replica claims expires; a decode leg whose
prefill replica died fails with UNAVAILABLE in bounded time; smg's own PD mode over a router of each replica gives
the native API's texts to the openai client. Every test ends with both sides' blocks free (test_pd_faults kills
replicas mid-request)."""
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import openai
import psutil
import pytest
import torch

from sluice.cli.gateway import GatewayLayout, start_gateway, wait_until_gateway_serves
from sluice.cli.launcher import free_port, free_ports, stop_services
from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient, text_request
from sluice.v1 import scheduler_pb2
from tests.e2e.hf_reference import hf_greedy
from tests.e2e.pd_services import SchedulerStream, running_pd_services, scraped, wait_for
from tests.e2e.served_greedy import FAMILY_PROMPTS, MAX_NEW_TOKENS, token_request
from tests.e2e.services import wait_for_serve
from tests.e2e.test_tensor_parallel import TEXTS

pytestmark = pytest.mark.slow

POOL = ["--num-blocks", "160", "--block-size", "16"]
LEASE_SECONDS, PULL_SECONDS = 2.0, 3.0
TIMEOUTS = ["--kv-lease-timeout", str(LEASE_SECONDS), "--kv-pull-timeout", str(PULL_SECONDS)]
PREFILL_LEG = scheduler_pb2.KvTransferParams(do_remote_decode=True)
RIVERS = [f"The rivers of Europe and the seas they flow into, one per line, longest first:\n{river}"
          for river in ("Volga", "Danube")]  # a full first block that no other test's prompt shares


@pytest.fixture(scope="module")
def pd(default_model_dir):
    with running_pd_services(default_model_dir, [*POOL, *TIMEOUTS]) as services:
        yield services


def test_greedy_tokens_are_hfs_and_a_single_replicas_alone_and_together(pd, default_model_dir, hf_greedy_of,
                                                                        hf_tokenizer):
    prompts = [hf_tokenizer(text).input_ids for text in TEXTS]  # a shared prefix of 2 blocks, then each its own
    expected = [hf_greedy_of(prompt, MAX_NEW_TOKENS) for prompt in prompts]
    assert pd.client.generate(token_request(prompts[0])).token_ids == expected[0]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda prompt: pd.client.generate(token_request(prompt)).token_ids, prompts))
    assert together == expected
    with pd.side_router("decode", default_model_dir) as address, SluiceClient(address) as single:
        assert [single.generate(token_request(prompt)).token_ids for prompt in prompts[:2]] == expected[:2]
    pd.wait_until_settled()
    assert pd.load("prefill").prefix_cache_hit_rate > 0 and pd.load("decode").prefix_cache_hit_rate > 0
    assert pd.metric("decode", "sluice:kv_transfer_bytes_total") > 0
    assert pd.metric("decode", "sluice:kv_transfer_seconds_count") >= 1
    assert pd.metric("decode", "sluice:kv_transfer_failures_total") == 0
    assert pd.metric("prefill", "sluice:kv_leases") == 0


def test_a_client_that_leaves_in_either_leg_or_during_the_pull_frees_both_sides(pd, hf_tokenizer):
    expired = pd.metric("prefill", "sluice:kv_leases_expired_total")
    long_prompt = hf_tokenizer(" ".join(["river"] * 800)).input_ids
    stream = pd.client.stream(token_request(long_prompt, max_tokens=64))
    wait_for(lambda: pd.load("prefill").num_running == 1)
    stream.cancel()  # in the prefill leg
    pd.wait_until_settled()
    with pd.decode_worker_stopped():
        stream = pd.client.stream(token_request(long_prompt[:80], max_tokens=8))
        pd.wait_until_pulling()
        stream.cancel()  # during the pull, which the stopped decode worker holds
        pd.wait_until_settled()
    pd.wait_until_settled()
    stream = pd.client.stream(token_request(long_prompt[:40], max_tokens=400, ignore_eos=True))
    next(stream)
    assert pd.load("decode").num_running == 1
    stream.cancel()  # in the decode leg
    pd.wait_until_settled()
    assert pd.metric("prefill", "sluice:kv_leases_expired_total") == expired  # the leases ended at once


def test_a_lease_no_decode_replica_claims_expires(pd):
    expired = pd.metric("prefill", "sluice:kv_leases_expired_total")
    leg = SchedulerStream(pd.addresses["prefill"])
    try:
        leg.submit("unclaimed", list(range(100, 150)), 8, PREFILL_LEG)
        finished = leg.ending("unclaimed")
        assert len(finished.kv_transfer.remote_block_ids) == 3 and finished.kv_transfer.do_remote_prefill
        load = pd.load("prefill")
        assert load.num_total_blocks - load.num_free_blocks == 3
        assert pd.metric("prefill", "sluice:kv_leases") == 1
        pd.wait_until_settled(timeout=LEASE_SECONDS + 2)
        assert pd.metric("prefill", "sluice:kv_leases_expired_total") == expired + 1
    finally:
        leg.close()


def test_smg_in_pd_mode_over_a_prefill_and_a_decode_router_gives_the_native_texts(pd, default_model_dir):
    """smg tags the prefill leg do_remote_decode, relays the kv_transfer_params_json it returns to the decode leg."""
    pulled = pd.metric("decode", "sluice:kv_transfer_seconds_count")
    with pd.side_router("prefill", default_model_dir) as prefill, pd.side_router("decode", default_model_dir) as decode:
        layout = GatewayLayout("127.0.0.1", *free_ports(2))
        gateway = start_gateway(layout, [decode], default_model_dir, ["--log-level", "warn"],
                                prefill_router_addresses=[prefill])
        try:
            wait_until_gateway_serves(layout, 90, gateway)
            with openai.OpenAI(base_url=f"{layout.url}/v1", api_key="unused", max_retries=0) as client:
                for text in RIVERS:
                    answer = client.completions.create(model=default_model_dir.name, prompt=text,
                                                       max_tokens=MAX_NEW_TOKENS, temperature=0)
                    native = pd.client.generate(text_request(text, max_tokens=MAX_NEW_TOKENS, temperature=0.0))
                    assert answer.choices[0].text == native.text
        finally:
            stop_services([gateway])
    assert pd.metric("decode", "sluice:kv_transfer_seconds_count") > pulled  # the first prompt's, not the second's
    pd.wait_until_settled()


def test_both_replicas_at_tp2_give_hfs_tokens_and_a_dead_prefill_rank_fails_the_decode_leg(tiny_qwen3):
    """One stack for both (a -tp 2 pair costs four worker processes): the dead rank comes last."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    expected = [hf_greedy(hf, prompt, MAX_NEW_TOKENS) for prompt in FAMILY_PROMPTS]
    with running_pd_services(tiny_qwen3, [*POOL, *TIMEOUTS], router_args=["--no-tokenizer"],
                             tensor_parallel_size=2) as services:
        with ThreadPoolExecutor(len(FAMILY_PROMPTS)) as pool:
            results = list(pool.map(lambda prompt: services.client.generate(token_request(prompt)).token_ids,
                                    FAMILY_PROMPTS))
        assert results == expected
        prefill, decode = SchedulerStream(services.addresses["prefill"]), SchedulerStream(services.addresses["decode"])
        try:
            prompt = list(range(1, 60))
            # a pair that succeeds: the decode ranks know their prefill peers when one dies
            assert isinstance(decode.ending(_pair(prefill, decode, "known", prompt)), scheduler_pb2.Finished)
            leased = _prefill_leg(prefill, "dead", prompt[::-1])
            rank_0 = next(process for process in psutil.Process(services.prefill_worker.pid).children()
                          if process.cmdline()[process.cmdline().index("--rank") + 1] == "0")
            rank_0.send_signal(signal.SIGKILL)
            started = time.monotonic()
            decode.submit("dead", prompt[::-1], 8, leased)
            rejection = decode.ending("dead")
            assert rejection.status_code == grpc.StatusCode.UNAVAILABLE.value[0], rejection
            assert time.monotonic() - started < 2 * PULL_SECONDS + 5
        finally:
            prefill.close()
            decode.close()
        load = services.load("decode")
        assert load.num_free_blocks == load.num_total_blocks and not load.num_running
        assert services.metric("decode", "sluice:kv_transfer_failures_total") == 1


def test_sluice_serve_pd_pairs_a_prefill_and_a_decode_replica():
    """Random weights of a tiny shape: the decode side's first token, from two pulled blocks and its own last eight
    tokens, is the one the prefill replica computes alone (it serves a one-token request whole); the metrics ports
    follow the documented layout (the decode scheduler's at P + 1, the prefill scheduler's at P + 3)."""
    port, metrics_port = free_port(), free_ports(1, run=5)[0]
    serve = subprocess.Popen([*sluice_command("serve"), "--pd", "--load-format", "dummy", "--model", "SmolLM2-tiny",
                              *POOL, "--port", str(port), "--metrics-port", str(metrics_port)],
                             stdout=subprocess.PIPE, text=True)
    try:
        wait_for_serve(serve)
        prompt = list(range(100, 140))
        with SluiceClient(f"127.0.0.1:{port}") as client:
            alone = client.generate(token_request(prompt, max_tokens=1)).token_ids
            paired = client.generate(token_request(prompt, max_tokens=6)).token_ids
        assert paired[:1] == alone and len(paired) == 6
        assert scraped(metrics_port + 1, "sluice:kv_transfer_bytes_total") > 0
        assert scraped(metrics_port + 3, "sluice:kv_leases") == 0
    finally:
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0


def _prefill_leg(prefill: SchedulerStream, request_id: str, prompt: list[int]) -> scheduler_pb2.KvTransferParams:
    prefill.submit(request_id, prompt, 8, PREFILL_LEG)
    return prefill.ending(request_id).kv_transfer


def _pair(prefill: SchedulerStream, decode: SchedulerStream, request_id: str, prompt: list[int]) -> str:
    """Sends a disaggregated request by hand: its prefill leg, then its decode leg. Returns its id."""
    decode.submit(request_id, prompt, 8, _prefill_leg(prefill, request_id, prompt))
    return request_id
