"""Pipeline-parallel replicas through the real services on the CPU (gloo): SmolLM2-135M (30 layers) at -pp 2 (15 + 15
layers), -pp 3 (8 + 11 + 11, by --pp-layer-partition) and -tp 3 -pp 2 gives Hugging Face's greedy tokens (as -pp 1
does, see test_greedy_matches_hf): one request alone, its 4 greedy samples (forked at once, preempted by a small KV
pool), and 8 requests at once with prefix-cache hits."""
import pytest

from tests.e2e.served_greedy import SMALL_POOL, assert_matches_alone_and_together
from tests.e2e.services import running_services
from tests.e2e.test_tensor_parallel import TEXTS

pytestmark = pytest.mark.slow

SPLITS = {
    "pp2": {"pipeline_parallel_size": 2},
    "pp3": {"pipeline_parallel_size": 3, "worker_args": ["--pp-layer-partition", "8,11,11"]},
    "tp3-pp2": {"tensor_parallel_size": 3, "pipeline_parallel_size": 2},
}


@pytest.mark.parametrize("split", SPLITS.values(), ids=SPLITS.keys())
def test_smollm2_split_into_stages_matches_hf(default_model_dir, hf_greedy_of, hf_tokenizer, split):
    prompts = [hf_tokenizer(text).input_ids for text in TEXTS]
    with running_services(default_model_dir, SMALL_POOL, **split) as services:
        assert_matches_alone_and_together(services, hf_greedy_of, prompts)
