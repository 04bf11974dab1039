"""Tensor-parallel replicas through the real services on the CPU (gloo): SmolLM2-135M (9 heads, 3 KV heads) at -tp 3
and a small random Qwen3 checkpoint at -tp 2 give Hugging Face's greedy tokens (as -tp 1 does, see
test_greedy_matches_hf): one request alone, its 4 greedy samples (forked at once, preempted by a small KV pool), and
8 requests at once with prefix-cache hits; losing one rank mid-stream ends every stream with UNAVAILABLE and the
replica serves again once its ranks are back."""
import signal
import subprocess
import threading
import time
from functools import partial

import grpc
import psutil
import pytest
import torch
from grpc_health.v1 import health_pb2

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.served_greedy import SMALL_POOL, assert_matches_alone_and_together, token_request
from tests.e2e.services import running_services, stream_to_its_end, wait_for_health

pytestmark = pytest.mark.slow

SCHEDULER_SERVICE = "sluice.v1.Scheduler"
_PREFIX = "Here is a short list of facts about the planets of the solar system, one per line:\n"
TEXTS = [f"{_PREFIX}{topic}" for topic in ("Mars", "Venus", "Jupiter", "Saturn", "Mercury", "Neptune", "Uranus",
                                           "Earth")]


def test_smollm2_at_tp3_matches_hf(default_model_dir, hf_greedy_of, hf_tokenizer):
    prompts = [hf_tokenizer(text).input_ids for text in TEXTS]
    with running_services(default_model_dir, SMALL_POOL, tensor_parallel_size=3) as services:
        assert_matches_alone_and_together(services, hf_greedy_of, prompts)


def _qwen3_matches_hf_at_tp2(folder, worker_args: list[str] = ()) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [[7 + i] * 20 + [i, 2 * i] for i in range(8)]  # a shared first block, then each its own
    with running_services(folder, SMALL_POOL, worker_args, router_args=["--no-tokenizer"],
                          tensor_parallel_size=2) as services:
        assert_matches_alone_and_together(services, partial(hf_greedy, hf), prompts)


def test_qwen3_shape_at_tp2_matches_hf(tiny_qwen3):
    _qwen3_matches_hf_at_tp2(tiny_qwen3)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_qwen3_shape_at_tp2_on_two_gpus_matches_hf(tiny_qwen3):
    """NCCL, the Triton kernels, and decode CUDA graphs with the collectives captured inside."""
    _qwen3_matches_hf_at_tp2(tiny_qwen3, ["--device", "cuda"])


def _stream(services, started: threading.Semaphore, codes: list) -> None:
    stream_to_its_end(services.client, token_request([5, 6, 7], max_tokens=450, ignore_eos=True), started, codes)


def test_losing_a_rank_ends_the_streams_and_the_restarted_ranks_serve(tiny_qwen3):
    with running_services(tiny_qwen3, router_args=["--no-tokenizer"], tensor_parallel_size=2) as services:
        short = token_request([1, 2, 3])
        expected = services.client.generate(short).token_ids
        num_blocks = services.load().num_total_blocks
        started, codes = threading.Semaphore(0), []
        streams = [threading.Thread(target=_stream, args=(services, started, codes)) for _ in range(3)]
        for stream in streams:
            stream.start()
        for _ in streams:
            assert started.acquire(timeout=60)

        group = services.processes[0]
        rank_1 = next(p for p in psutil.Process(group.pid).children() if "--rank" in p.cmdline()
                      and p.cmdline()[p.cmdline().index("--rank") + 1] == "1")
        rank_1.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        for stream in streams:
            stream.join(timeout=10)
        assert codes == [grpc.StatusCode.UNAVAILABLE] * 3
        assert time.monotonic() - killed < 10
        scheduler = services.layout.scheduler_address
        wait_for_health(scheduler, SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING, timeout=5)
        load = services.load()
        assert (load.num_running, load.num_waiting, load.num_free_blocks) == (0, 0, num_blocks)
        assert group.wait(timeout=10) != 0  # the group stops its other rank and exits, to be started again

        services.processes[0] = subprocess.Popen(group.args, env=services.env)
        wait_for_health(scheduler, SCHEDULER_SERVICE, health_pb2.HealthCheckResponse.SERVING, timeout=120)
        assert services.client.generate(short).token_ids == expected
