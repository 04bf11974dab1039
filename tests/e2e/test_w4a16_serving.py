"""4-bit act-order checkpoints (a tiny Llama in GPTQ with zero points; a tiny Qwen3-MoE in compressed-tensors' actorder
"group", its experts too) served through the real services at tensor_parallel_size 2 without --quantization: the
worker reads the quantization_config, GetModelInfo reports the method, and the greedy tokens are those of Hugging Face
running the same model dequantized in float32, alone, forked over a small KV pool and 8 requests at once. Each rank
holds its q/k/v and gate/up rows sorted by group, and its run of o_proj's and the down projections' inputs, each
naming its group."""
from functools import partial

import pytest
import torch

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.served_greedy import SMALL_POOL, assert_matches_alone_and_together
from tests.e2e.services import running_services
from tests.worker.test_w4a16_moe import FAMILIES, VARIANTS
from tests.worker.w4a16_checkpoints import TINY_LLAMA, Variant, write_w4a16_checkpoint

pytestmark = pytest.mark.slow

PROMPTS = [[7 + i] * 20 + [i, 2 * i] for i in range(8)]  # a shared first block, then each its own


CHECKPOINTS = {"llama-gptq": (Variant("gptq", sym=False, act_order=True), TINY_LLAMA),
               "qwen3-moe-compressed-tensors": (VARIANTS["ct-actorder"], FAMILIES["qwen3-moe"])}


@pytest.mark.parametrize("checkpoint", sorted(CHECKPOINTS))
def test_served_act_order_checkpoint_at_2_ranks_matches_hf_on_its_dequantized_model(tmp_path, checkpoint):
    from transformers import AutoModelForCausalLM

    variant, hf_config = CHECKPOINTS[checkpoint]
    folder, dequantized = write_w4a16_checkpoint(tmp_path, variant, hf_config)
    hf = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    with running_services(folder, SMALL_POOL, router_args=["--no-tokenizer"], tensor_parallel_size=2) as services:
        assert services.client.model_info().quantization == variant.method
        assert_matches_alone_and_together(services, partial(hf_greedy, hf), PROMPTS)
