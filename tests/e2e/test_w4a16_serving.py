"""A 4-bit GPTQ checkpoint (zero points, act-order) served through the real services without --quantization: the
worker reads its quantization_config, GetModelInfo reports "gptq", and its greedy tokens are those of Hugging Face
running the same model dequantized in float32, alone, forked over a small KV pool and 8 requests at once."""
from functools import partial

import pytest
import torch

from tests.e2e.hf_reference import hf_greedy
from tests.e2e.served_greedy import SMALL_POOL, assert_matches_alone_and_together
from tests.e2e.services import running_services
from tests.worker.w4a16_checkpoints import Variant, write_w4a16_checkpoint

pytestmark = pytest.mark.slow

PROMPTS = [[7 + i] * 20 + [i, 2 * i] for i in range(8)]  # a shared first block, then each its own


def test_served_gptq_checkpoint_matches_hf_on_its_dequantized_model(tmp_path):
    from transformers import AutoModelForCausalLM

    folder, dequantized = write_w4a16_checkpoint(tmp_path, Variant("gptq", sym=False, act_order=True))
    hf = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    with running_services(folder, SMALL_POOL, router_args=["--no-tokenizer"]) as services:
        assert services.client.model_info().quantization == "gptq"
        assert_matches_alone_and_together(services, partial(hf_greedy, hf), PROMPTS)
