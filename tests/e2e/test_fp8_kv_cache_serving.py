"""`sluice worker --kv-cache-dtype fp8` through the real services, prefix caching on: the model info names the FP8
cache, and a story, then its continuation (which reads the story's first block from the prefix cache), come out
token for token as the same engine generates them in process; with --calculate-kv-scales, with the scales the
story's prefill sets."""
import pytest

from sluice.cli.offline import OfflineEngine
from sluice.client import sampling_params
from sluice.core.sampling_params import SamplingParams
from sluice.v1 import generation_pb2 as pb
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow

STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who every morning"
CONTINUED = STORY + " walked down to the harbour. One day, he found"
MAX_TOKENS = 12


def _in_process(model_dir, prompts: list[list[int]], **config) -> list[list[int]]:
    engine = OfflineEngine(WorkerEngine.load(WorkerConfig(model=str(model_dir), **config)), enable_prefix_caching=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [engine.generate([prompt], [params])[0].token_ids for prompt in prompts]


@pytest.mark.parametrize("calculate_kv_scales", [False, True])
def test_served_fp8_cache_generates_what_the_fp8_engine_does(default_model_dir, hf_tokenizer, calculate_kv_scales):
    prompts = [hf_tokenizer(text).input_ids for text in (STORY, CONTINUED)]
    expected = _in_process(default_model_dir, prompts, kv_cache_dtype="fp8", calculate_kv_scales=calculate_kv_scales)
    other = _in_process(default_model_dir, prompts, kv_cache_dtype="fp8" if calculate_kv_scales else "auto")
    assert expected[1] != other[1]  # the continuation tells the caches (or their scales) apart
    worker_args = ["--kv-cache-dtype", "fp8", *(["--calculate-kv-scales"] * calculate_kv_scales)]
    with running_services(default_model_dir, worker_args=worker_args) as services:
        info = services.client.model_info()
        results = [services.client.generate(pb.GenerateRequest(
            tokens=pb.TokenIds(ids=prompt),
            sampling=sampling_params(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))) for prompt in prompts]
        assert services.wait_until_idle().num_free_blocks == info.num_kv_blocks  # no block held after the requests
    assert (info.kv_cache_dtype, info.quantization) == ("fp8", "")
    assert info.num_kv_blocks == (1 << 30) // (30 * 2 * 3 * 64 * 16)  # the default 1 GiB in one-byte elements
    assert [result.usage["cached_tokens"] for result in results] == [0, 16]
    assert [list(result.token_ids) for result in results] == expected
