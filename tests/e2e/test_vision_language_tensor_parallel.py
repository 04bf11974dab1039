"""The tiny random Qwen2.5-VL of test_vision_language_serving at -tp 2: each rank holds the whole vision tower and
encodes, holds and drops the images' outputs as every step says, so 8 prompts of 0, 1 and 2 images at once over a
small KV pool give transformers' greedy tokens."""
import pytest

from tests.e2e.served_greedy import SMALL_POOL
from tests.e2e.served_images import assert_eight_at_once_match_hf, processed_images, tiny_checkpoint
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow


def test_eight_at_once_at_tp2_match_hf(tmp_path, default_model_dir):
    folder, hf = tiny_checkpoint(tmp_path, default_model_dir)
    with running_services(folder, [*SMALL_POOL, "--max-num-batched-tokens", "32", "--encoder-cache-size", "32"],
                          tensor_parallel_size=2) as services:
        assert_eight_at_once_match_hf(services, hf, processed_images())
