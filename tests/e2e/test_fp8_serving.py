"""`sluice worker --quantization fp8`, and a pre-quantized FP8 folder served as it is, through the real services: the
worker serves the FP8 model, token for token what the same engine generates in process."""
import pytest

from sluice.client import sampling_params
from sluice.v1 import generation_pb2 as pb
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from tests.e2e.services import running_services
from tests.worker.fp8_checkpoints import write_fp8_checkpoint, write_kv_cache_scales
from tests.worker.stepping import run_greedy

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time, in a small village,"
MAX_TOKENS = 12


def test_served_fp8_model_generates_what_the_fp8_engine_does(default_model_dir, hf_tokenizer):
    prompt_ids = hf_tokenizer(PROMPT).input_ids
    engine = WorkerEngine.load(WorkerConfig(model=str(default_model_dir), quantization="fp8"))
    expected = run_greedy(engine, [prompt_ids], MAX_TOKENS, chunk=1000)[0]
    unquantized = run_greedy(WorkerEngine.load(WorkerConfig(model=str(default_model_dir))), [prompt_ids], MAX_TOKENS,
                             chunk=1000)[0]
    assert expected != unquantized  # this prompt tells the two models apart
    with running_services(default_model_dir, worker_args=["--quantization", "fp8"]) as services:
        assert services.client.model_info().quantization == "fp8"
        result = services.client.generate(pb.GenerateRequest(
            tokens=pb.TokenIds(ids=prompt_ids),
            sampling=sampling_params(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)))
    assert list(result.token_ids) == expected


@pytest.mark.parametrize("method, strategy", [("compressed-tensors", "tensor"), ("fp8", "block"),
                                              ("fbgemm_fp8", "channel")])
def test_served_fp8_checkpoint_generates_what_the_engine_loads_from_it(default_model_dir, tmp_path, hf_tokenizer,
                                                                       method, strategy):
    """No --quantization: the worker reads the folder's quantization_config (per tensor, in blocks that it quantizes
    again per channel, or fbgemm_fp8's per channel under its activation_scale_ub; layer 0's down projection on its
    ignore list, unquantized) and its calibrated KV-cache scales (fbgemm_fp8 has none), stored with under
    --kv-cache-dtype fp8; the router tokenizes with the folder's tokenizer."""
    folder = write_fp8_checkpoint(default_model_dir, tmp_path / "fp8", method, strategy,
                                  ignore=("model.layers.0.mlp.down_proj",))
    if method != "fbgemm_fp8":
        write_kv_cache_scales(folder, k_scale=0.25, v_scale=0.125)
    engine = WorkerEngine.load(WorkerConfig(model=str(folder), kv_cache_dtype="fp8"))
    expected = run_greedy(engine, [hf_tokenizer(PROMPT).input_ids], MAX_TOKENS, chunk=1000)[0]
    with running_services(folder, worker_args=["--kv-cache-dtype", "fp8"]) as services:
        info = services.client.model_info()
        assert (info.quantization, info.kv_cache_dtype) == ("fp8", "fp8")
        result = services.client.generate(pb.GenerateRequest(
            text=PROMPT, sampling=sampling_params(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)))
    assert list(result.token_ids) == expected
    assert result.text == hf_tokenizer.decode(expected)
