"""Pipeline-parallel replicas through the real services on the CPU (gloo). SmolLM2-135M (30 layers) at -pp 2 (15 + 15
layers, prompts prefilled in chunks), -pp 3 (8 + 11 + 11, by --pp-layer-partition) and -tp 3 -pp 2 gives Hugging
Face's greedy tokens (as -pp 1 does, see test_greedy_matches_hf): one request alone, its 4 greedy samples (forked at
once, preempted by a small KV pool), and 8 requests at once with prefix-cache hits; at -pp 2 also its logprobs,
structured output and seeded sampling. So does a small random Qwen3 checkpoint at -tp 2 -pp 2, and at -pp 2 with its
stages in worker processes of their own (--pp-rank), as on two hosts, where losing a stage's rank, killed or
stopped, mid-stream ends every stream with UNAVAILABLE and the replica serves again once its stages are back. Two
stages of a stand-in step time run two steps at once."""
import os
import signal
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from sluice.cli.launcher import ServeLayout, free_port, start_routers, stop_services, wait_until_serving
from sluice.cli.offline import OfflineEngine
from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient, sampling_params, scheduler_load
from sluice.core.sampling_params import SamplingParams
from sluice.v1 import generation_pb2 as pb
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.e2e.hf_reference import hf_greedy
from tests.e2e.served_greedy import (FAMILY_PROMPTS, MAX_NEW_TOKENS, SMALL_POOL, assert_matches_alone_and_together,
                                     assert_served_logprobs_match_hf, assert_structured_output_holds, token_request)
from tests.e2e.services import rank_process, running_services, stream_to_its_end, wait_for_health
from tests.e2e.test_rank_failures import NOT_SERVING, NUM_STREAMS, SERVING, STEP_TIMEOUT
from tests.e2e.test_tensor_parallel import TEXTS

pytestmark = pytest.mark.slow

STAGE_TIME = Path(__file__).parent / "stage_time"
STAND_IN_STAGE_SECONDS = 0.1
CHUNKED = ["--max-num-batched-tokens", "40"]  # the 8 prompts of about 25 tokens prefill in chunks over steps
SPLITS = {
    "pp3": {"pipeline_parallel_size": 3, "worker_args": ["--pp-layer-partition", "8,11,11"]},
    "tp3-pp2": {"tensor_parallel_size": 3, "pipeline_parallel_size": 2},
}


@pytest.fixture(scope="module")
def smollm2_pp2(default_model_dir):
    with running_services(default_model_dir, [*SMALL_POOL, *CHUNKED], pipeline_parallel_size=2) as services:
        yield services


def test_smollm2_at_pp2_matches_hf(smollm2_pp2, hf_greedy_of, hf_tokenizer):
    assert_matches_alone_and_together(smollm2_pp2, hf_greedy_of, [hf_tokenizer(text).input_ids for text in TEXTS])


def test_logprobs_structured_output_and_seeded_sampling_at_pp2(smollm2_pp2, default_model_dir, hf_model,
                                                               hf_tokenizer):
    """Logprobs of the prompt and the output are Hugging Face's; grammars hold; a seeded sampled request draws the
    tokens it draws from one unsplit worker in process."""
    assert_served_logprobs_match_hf(smollm2_pp2, hf_model, hf_tokenizer(TEXTS[0]).input_ids)
    assert_structured_output_holds(smollm2_pp2, hf_model, hf_tokenizer)
    prompt = hf_tokenizer("The old lighthouse keeper").input_ids
    seeded = {"temperature": 1.0, "top_p": 0.95, "seed": 99, "max_tokens": 16}
    served = smollm2_pp2.client.generate(pb.GenerateRequest(tokens=pb.TokenIds(ids=prompt),
                                                            sampling=sampling_params(**seeded)))
    engine = OfflineEngine(WorkerEngine.load(WorkerConfig(model=str(default_model_dir))), num_blocks=16)
    assert served.token_ids == engine.generate([prompt], [SamplingParams(**seeded)])[0].token_ids


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_smollm2_split_into_stages_matches_hf(default_model_dir, hf_greedy_of, hf_tokenizer, split):
    prompts = [hf_tokenizer(text).input_ids for text in TEXTS]
    with running_services(default_model_dir, SMALL_POOL, **split) as services:
        assert_matches_alone_and_together(services, hf_greedy_of, prompts)


def _qwen3_matches_hf(folder, tensor_parallel_size: int, pipeline_parallel_size: int, worker_args=()) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with running_services(folder, SMALL_POOL, worker_args, router_args=["--no-tokenizer"],
                          tensor_parallel_size=tensor_parallel_size,
                          pipeline_parallel_size=pipeline_parallel_size) as services:
        assert_matches_alone_and_together(services, partial(hf_greedy, hf), FAMILY_PROMPTS)


def test_qwen3_shape_at_tp2_pp2_matches_hf(tiny_qwen3):
    """Qwen3's per-head q/k norms, 2 tensor-parallel ranks in each of 2 stages of one layer."""
    _qwen3_matches_hf(tiny_qwen3, 2, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_parallel_size, pipeline_parallel_size", [(1, 2), (2, 2)], ids=["pp2", "tp2-pp2"])
def test_qwen3_shape_split_over_gpus_matches_hf(tiny_qwen3, tensor_parallel_size, pipeline_parallel_size):
    """NCCL between the stages and inside them, each stage's CUDA graphs (decode and piecewise, the transfers between
    their replays) and the Triton kernels (float32: Hugging Face's tokens)."""
    if torch.cuda.device_count() < tensor_parallel_size * pipeline_parallel_size:
        pytest.skip(f"needs {tensor_parallel_size * pipeline_parallel_size} CUDA devices")
    _qwen3_matches_hf(tiny_qwen3, tensor_parallel_size, pipeline_parallel_size, ["--device", "cuda"])


def _steps_run(services, rank: int) -> float:
    """The steps rank `rank` has run, from its worker_step_seconds histogram."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{services.metrics_ports['worker'] + rank}/metrics").read()
    return next(sample.value for family in text_string_to_metric_families(text.decode())
                for sample in family.samples if sample.name == "sluice:worker_step_seconds_count")


def test_two_stages_of_a_fixed_step_time_run_two_steps_at_once():
    """A stand-in pipeline: each stage's pass takes STAND_IN_STAGE_SECONDS longer (stage_time/sitecustomize.py), which
    outweighs the rest. One step in flight would run a step every 2 stage times; with the pipeline kept full, the
    steps per second are at least 1.8 times that."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(STAGE_TIME), os.environ.get("PYTHONPATH")])),
           "SLUICE_TEST_STAGE_SECONDS": str(STAND_IN_STAGE_SECONDS)}
    with running_services("SmolLM2-tiny", (), ["--load-format", "dummy"], router_args=["--no-tokenizer"],
                          pipeline_parallel_size=2, env=env) as services:
        services.client.generate(token_request([1, 2, 3], max_tokens=4))
        before, started = _steps_run(services, 1), time.perf_counter()  # rank 1, the last stage
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: services.client.generate(token_request([5 + i] * 10, 30, ignore_eos=True)),
                          range(8)))
        steps_per_second = (_steps_run(services, 1) - before) / (time.perf_counter() - started)
    assert steps_per_second >= 1.8 / (2 * STAND_IN_STAGE_SECONDS), f"{steps_per_second:.2f} steps a second"


def _start_stage(folder, stage: int, address: str, init_address: str) -> subprocess.Popen:
    """A stage's ranks on a host of their own: --pp-rank, meeting the other stage at init_address."""
    return subprocess.Popen(sluice_command("worker", "--model", str(folder), "-pp", "2", "--pp-rank", str(stage),
                                           "--dist-init-address", init_address, "--dist-timeout", "10",
                                           "--drain-timeout", "2", "--listen", address))


def test_stages_started_apart_serve_and_a_rank_killed_or_stopped_ends_the_streams_until_they_restart(tiny_qwen3):
    """At -pp 2, each stage in a worker process of its own (as on two hosts), meeting at the first one's
    --dist-init-address: Hugging Face's greedy tokens. Then the last stage's rank (the driver) killed, and the first
    stage's stopped (the step timeout notices it): every stream ends with UNAVAILABLE, the scheduler and the router go
    NOT_SERVING, and the stages, restarted together, serve the same tokens."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32).eval()
    layout = ServeLayout.on_free_ports(num_ranks=2)
    addresses, init_address = layout.worker_addresses.split(","), f"127.0.0.1:{free_port()}"
    stages = [_start_stage(tiny_qwen3, stage, address, init_address) for stage, address in enumerate(addresses)]
    others = [subprocess.Popen(sluice_command("scheduler", "--listen", layout.scheduler_address, "--worker",
                                              layout.worker_addresses, "--step-timeout", str(STEP_TIMEOUT))),
              *start_routers(layout, [["--no-tokenizer"]])]
    client = None
    try:
        wait_until_serving(layout.router_address, "sluice.v1.Generation", 300, stages + others)
        client = SluiceClient(layout.router_address)
        expected = [client.generate(token_request(prompt)).token_ids for prompt in FAMILY_PROMPTS[:2]]
        assert expected == [hf_greedy(hf, prompt, MAX_NEW_TOKENS) for prompt in FAMILY_PROMPTS[:2]]
        for stage, stop in ((1, False), (0, True)):
            started, codes = threading.Semaphore(0), []
            streams = [threading.Thread(target=stream_to_its_end, args=(
                client, token_request([5, 6, 7], max_tokens=450, ignore_eos=True), started, codes))
                for _ in range(NUM_STREAMS)]
            for stream in streams:
                stream.start()
            for _ in streams:
                assert started.acquire(timeout=60)

            rank = rank_process(stages[stage], stage)
            rank.send_signal(signal.SIGSTOP if stop else signal.SIGKILL)
            for stream in streams:
                stream.join(timeout=3 * STEP_TIMEOUT + 5)
            assert codes == [grpc.StatusCode.UNAVAILABLE] * NUM_STREAMS, f"stage {stage}"
            wait_for_health(layout.scheduler_address, "sluice.v1.Scheduler", NOT_SERVING, timeout=2)
            wait_for_health(layout.router_address, "sluice.v1.Generation", NOT_SERVING, timeout=2)
            load = scheduler_load(layout.scheduler_address)
            assert (load.num_running, load.num_waiting, load.num_free_blocks) == (0, 0, load.num_total_blocks)
            if stop:
                rank.send_signal(signal.SIGKILL)
            assert stages[stage].wait(timeout=30) != 0  # the stage stops its other ranks and exits
            stop_services(stages)  # the stages meet again only all together
            stages = [_start_stage(tiny_qwen3, s, address, init_address) for s, address in enumerate(addresses)]
            wait_for_health(layout.router_address, "sluice.v1.Generation", SERVING, timeout=120)
            assert [client.generate(token_request(prompt)).token_ids for prompt in FAMILY_PROMPTS[:2]] == expected
    finally:
        if client is not None:
            client.close()
        stop_services(stages + others)
