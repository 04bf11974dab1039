"""gpt-oss served through the real services (random weights of the serving tokenizer's vocabulary, MXFP4 experts,
token ids in and out), with a window shorter than the prompts in every other layer, sinks, biased experts and YaRN
rope: Hugging Face's greedy tokens alone, forked over a small KV pool (preemption) and 8 at once with prefix-cache
hits, and JSON its schema accepts, on one worker (proposing by ngram) and at -tp 2; with `--quantization fp8` on one
worker, the tokens the worker's engine generates in process in FP8."""

import pytest

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.e2e.served_greedy import (FAMILY_PROMPTS, ONE_WORKER_AND_TP2, SMALL_POOL, assert_family_served_like_hf,
                                     assert_matches_alone_and_together, copy_tokenizer, engine_greedy)
from tests.e2e.services import running_services
from tests.worker.test_gpt_oss import MXFP4, TINY_GPT_OSS, _hf_model, gpt_oss_state, mxfp4_checkpoint

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, default_model_dir, hf_tokenizer):
    """(the MXFP4 checkpoint's folder, Hugging Face's model of its dequantized weights)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    hf_config = {**TINY_GPT_OSS, "vocab_size": len(hf_tokenizer)}
    folder = copy_tokenizer(default_model_dir, tmp_path_factory.mktemp("gpt-oss"))
    packed, dequantized = mxfp4_checkpoint(gpt_oss_state(hf_config))
    save_file(packed, folder / "model.safetensors")
    AutoConfig.for_model(**hf_config, quantization_config=MXFP4).save_pretrained(folder)
    return folder, _hf_model(hf_config, dequantized)


@pytest.mark.parametrize("parallelism", sorted(ONE_WORKER_AND_TP2))
def test_served_gpt_oss_matches_hf(checkpoint, parallelism, hf_tokenizer):
    folder, hf = checkpoint
    scheduler_args, tensor_parallel_size = ONE_WORKER_AND_TP2[parallelism]
    with running_services(folder, [*scheduler_args, *SMALL_POOL],
                          tensor_parallel_size=tensor_parallel_size) as services:
        assert_family_served_like_hf(services, hf, hf_tokenizer, proposing=bool(scheduler_args))


def test_served_fp8_gpt_oss_generates_what_the_fp8_engine_does(checkpoint):
    """The MXFP4 experts dequantized, then quantized per row with the attention projections."""
    folder, _ = checkpoint
    engine = WorkerEngine.load(WorkerConfig(model=str(folder), quantization="fp8"))
    with running_services(folder, SMALL_POOL, ["--quantization", "fp8"], router_args=["--no-tokenizer"]) as services:
        assert services.client.model_info().quantization == "fp8"
        assert_matches_alone_and_together(services, engine_greedy(engine, TINY_GPT_OSS["eos_token_id"]), FAMILY_PROMPTS)
