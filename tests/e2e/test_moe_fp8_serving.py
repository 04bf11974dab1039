"""A mixture of FP8 experts served through the real services at -tp 2 (random weights, token ids in and out): a tiny
Qwen3-MoE stored as Qwen3-30B-A3B-FP8 is (weight_block_size, a weight_scale_inv for each expert's projection), each
rank holding whole blocks of every expert's intermediate columns, gives the tokens that the worker's engine generates
in process on one rank, alone, forked over a small KV pool (preemption) and 8 at once with prefix-cache hits. FP8
weights cannot give Hugging Face's float tokens; the folder leaves its row-parallel projections unquantized
(test_moe_fp8.ROW_PARALLEL), so that two ranks compute what one does."""
import pytest

from sluice.worker.config import WorkerConfig
from tests.e2e.served_greedy import FAMILY_PROMPTS, SMALL_POOL, assert_matches_alone_and_together, engine_greedy
from tests.e2e.services import running_services
from tests.worker.fp8_checkpoints import write_fp8_checkpoint
from tests.worker.test_moe_families import TINY_MOE, load_engine, write_tiny_moe
from tests.worker.test_moe_fp8 import BLOCK, ROW_PARALLEL

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    source = write_tiny_moe(tmp_path_factory.mktemp("qwen3-moe"), "qwen3-moe")
    return write_fp8_checkpoint(source, tmp_path_factory.mktemp("fp8") / "qwen3-moe", "fp8", "block", ROW_PARALLEL,
                                BLOCK)


def test_served_fp8_experts_at_tp2_generate_what_one_rank_does(folder):
    greedy = engine_greedy(load_engine(folder, WorkerConfig(model=str(folder))), TINY_MOE["eos_token_id"])
    with running_services(folder, SMALL_POOL, router_args=["--no-tokenizer"], tensor_parallel_size=2) as services:
        assert services.client.model_info().quantization == "fp8"
        assert_matches_alone_and_together(services, greedy, FAMILY_PROMPTS)
