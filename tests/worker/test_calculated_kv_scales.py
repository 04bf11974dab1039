"""`--calculate-kv-scales` on a tiny Llama whose keys and values reach far past e4m3's range (448) at a scale of 1.0:
the first step sets each layer's scales from what it stores, once, and the FP8 cache then gives about the logits of the
unquantized cache."""
import json

import pytest
import torch
import torch.nn.functional as F

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.ops.fp8 import FP8_MAX
from sluice.worker.runner.kv_scale_calibration import KEY_HEADROOM, VALUE_HEADROOM
from tests.worker.stepping import prompt_logits, run_greedy
from tests.worker.test_model_families import _TINY, FAMILIES

PROMPT = list(range(3, 40))
LOUDNESS = 5000


@pytest.fixture(scope="module")
def loud_checkpoint(tmp_path_factory):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("loud-llama")
    hf_config = {**_TINY, **FAMILIES["llama"]}
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=2)
    # keys and values 5,000 times louder, queries and o_proj as much quieter: the same model, whose cache needs scales
    loudness = {"k_proj.weight": LOUDNESS, "v_proj.weight": LOUDNESS, "q_proj.weight": 1 / LOUDNESS,
                "o_proj.weight": 1 / LOUDNESS}
    state = {name: t * loudness.get(".".join(name.split(".")[-2:]), 1) for name, t in state.items()}
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(hf_config))
    return folder


def _engine(folder, **config) -> WorkerEngine:
    return WorkerEngine.load(WorkerConfig(model=str(folder), **config))


def test_the_first_step_alone_sets_the_scales_from_what_the_cache_stores(loud_checkpoint):
    """The prompt is prefilled 4 tokens a step: the scales come from the first 4 keys and values (block 0, slots 0-3
    of the unquantized cache) and stay as they are through the later steps. Layer 0's keys and values come from the
    embeddings alone, so its scales match exactly; the later layers' inputs carry the FP8 cache's error (0.2%)."""
    exact, calculated = _engine(loud_checkpoint), _engine(loud_checkpoint, kv_cache_dtype="fp8",
                                                          calculate_kv_scales=True)
    for engine in (exact, calculated):
        run_greedy(engine, [PROMPT], 4, chunk=4)
    for index, (layer, (key_cache, value_cache)) in enumerate(zip(calculated.model.layers, exact.runner.kv_caches)):
        rtol = 1e-5 if index == 0 else 1e-2
        assert key_cache[:3].abs().max() > 2 * FP8_MAX  # the prompt's keys, beyond e4m3 at a scale of 1.0
        first_keys, first_values = key_cache[0, :4], value_cache[0, :4]
        assert value_cache[:3].abs().max() > first_values.abs().max()  # later steps would have set another scale
        torch.testing.assert_close(layer.self_attn.k_scale, first_keys.abs().max() * KEY_HEADROOM / FP8_MAX,
                                   rtol=rtol, atol=0)
        torch.testing.assert_close(layer.self_attn.v_scale, first_values.abs().max() * VALUE_HEADROOM / FP8_MAX,
                                   rtol=rtol, atol=0)


def test_calculated_scales_keep_the_logits_of_the_unquantized_cache(loud_checkpoint):
    """At a scale of 1.0 the keys and values are clipped to 448 (measured: mean KL 3.4e-3 to the unquantized cache);
    with the scales the first step set, 1.7e-6."""
    exact = prompt_logits(_engine(loud_checkpoint), PROMPT)
    clipped = prompt_logits(_engine(loud_checkpoint, kv_cache_dtype="fp8"), PROMPT)
    calculated_engine = _engine(loud_checkpoint, kv_cache_dtype="fp8", calculate_kv_scales=True)
    run_greedy(calculated_engine, [PROMPT], 1, chunk=1000)
    calculated = prompt_logits(calculated_engine, PROMPT)

    def kl_to_exact(logits: torch.Tensor) -> float:
        return F.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(exact, -1), log_target=True,
                        reduction="none").sum(-1).mean().item()
    assert kl_to_exact(calculated) < 0.1 * kl_to_exact(clipped)


def test_calculating_scales_needs_an_fp8_cache():
    with pytest.raises(ValueError, match="calculate_kv_scales needs an FP8 KV cache"):
        WorkerConfig(model="m", calculate_kv_scales=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_graphs_captured_before_the_first_step_read_the_calculated_scales():
    from sluice.cli.offline import OfflineEngine
    from sluice.core.sampling_params import SamplingParams

    tokens, scales = {}, {}
    for enforce_eager in (True, False):
        worker = WorkerEngine.load(WorkerConfig(model="Qwen3-0.6B", load_format="dummy", dtype="bfloat16",
                                                device="cuda", kv_cache_dtype="fp8", calculate_kv_scales=True,
                                                enforce_eager=enforce_eager, gpu_memory_utilization=0.3))
        engine = OfflineEngine(worker, max_model_len=1024, max_num_seqs=16)
        prompts = [list(range(7 * i + 1, 7 * i + 1 + 60 + 30 * i)) for i in range(5)]
        params = [SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True) for _ in range(5)]
        tokens[enforce_eager] = [result.token_ids for result in engine.generate(prompts, params)]
        scales[enforce_eager] = [layer.self_attn.k_scale.item() for layer in worker.model.layers]
        del engine, worker
        torch.cuda.empty_cache()
    assert scales[True] == scales[False] and 1.0 not in scales[True]
    assert tokens[False] == tokens[True]
