"""A tensor-parallel scheduler survives its ranks' failures, time after time: at -tp 3, one rank killed or stopped
(a stopped rank is noticed by the step timeout) ends every stream with UNAVAILABLE, the scheduler and the router go
NOT_SERVING within 2 s, the scheduler keeps running while it waits for its ranks, and serves the restarted group."""
import json
import signal
import subprocess
import threading
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2

from sluice.v1 import generation_pb2 as pb
from sluice.worker.loading.dummy_weights import random_state_dict
from tests.e2e.services import rank_process, running_services, stream_to_its_end, wait_for_health

pytestmark = pytest.mark.slow

REPETITIONS = 6  # each of the 3 ranks killed once and stopped once (rank repetition % 3, stopped when odd)
STEP_TIMEOUT = 2.0
NUM_STREAMS = 2
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96,
              "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3,
              "head_dim": 16, "vocab_size": 384, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
              "eos_token_id": 0}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A Llama-shaped Hugging Face folder of random weights whose heads split over 3 ranks."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    folder = tmp_path_factory.mktemp("tiny-llama-tp3")
    save_file(random_state_dict(TINY_LLAMA, torch.float32, torch.device("cpu"), seed=3), folder / "model.safetensors")
    AutoConfig.for_model(**TINY_LLAMA).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    return folder


def _request(max_tokens: int, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=[5, 6, 7]),
                              sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling))


def test_the_scheduler_survives_ranks_killed_and_stopped_again_and_again(tiny_llama):
    with running_services(tiny_llama, ["--step-timeout", str(STEP_TIMEOUT)], ["--dist-timeout", "10"],
                          router_args=["--no-tokenizer"], tensor_parallel_size=3) as services:
        scheduler, router = services.layout.scheduler_address, services.layout.router_address
        expected = services.client.generate(_request(8)).token_ids
        for repetition in range(REPETITIONS):
            stop = repetition % 2 == 1
            started, codes = threading.Semaphore(0), []
            streams = [threading.Thread(target=stream_to_its_end, args=(
                services.client, _request(1000, ignore_eos=True), started, codes)) for _ in range(NUM_STREAMS)]
            for stream in streams:
                stream.start()
            for _ in streams:
                assert started.acquire(timeout=60)

            group = services.processes[0]
            rank = rank_process(group, repetition % 3)
            rank.send_signal(signal.SIGSTOP if stop else signal.SIGKILL)
            for stream in streams:
                stream.join(timeout=3 * STEP_TIMEOUT + 5)
            assert codes == [grpc.StatusCode.UNAVAILABLE] * NUM_STREAMS, f"repetition {repetition}"
            wait_for_health(scheduler, "sluice.v1.Scheduler", NOT_SERVING, timeout=2)
            wait_for_health(router, "sluice.v1.Generation", NOT_SERVING, timeout=2)
            time.sleep(1.0)  # the scheduler sets the ranks it can reach up again meanwhile
            if stop:
                rank.send_signal(signal.SIGKILL)
            assert group.wait(timeout=30) != 0  # the group stops its other ranks and exits, to be started again
            assert services.processes[1].poll() is None, f"the scheduler exited at repetition {repetition}"

            services.processes[0] = subprocess.Popen(group.args, env=services.env)
            wait_for_health(router, "sluice.v1.Generation", SERVING, timeout=120)
            assert services.client.generate(_request(8)).token_ids == expected
        assert services.wait_until_idle().num_free_blocks == services.load().num_total_blocks
