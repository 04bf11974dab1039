"""The FP8 KV cache in the worker: the scales a checkpoint gives, what lands in the cache, the pool's size at one
memory budget, and the configurations refused before the weights load."""
import json

import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.kv_scales import with_kv_scales
from tests.worker.stepping import run_greedy
from tests.worker.test_model_families import _TINY, FAMILIES

FP8 = torch.float8_e4m3fn
PROMPT = list(range(3, 40))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A tiny Llama folder whose layer 0 stores k_scale / v_scale and layer 1 k_proj / v_proj output scales."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny-llama")
    hf_config = {**_TINY, **FAMILIES["llama"]}
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=1)
    state = {name: t if name.endswith("norm.weight") else t * 10 for name, t in state.items()}  # lively K/V
    state |= {"model.layers.0.self_attn.k_scale": torch.tensor(0.5),
              "model.layers.0.self_attn.v_scale": torch.tensor(0.25),
              "model.layers.1.self_attn.k_proj.output_scale": torch.tensor([2.0]),
              "model.layers.1.self_attn.v_proj.output_scale": torch.tensor([4.0])}
    save_file(state, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(hf_config))
    return folder


def test_checkpoint_scales_reach_the_layers_in_float32(tiny_checkpoint):
    engine = WorkerEngine.load(WorkerConfig(model=str(tiny_checkpoint), dtype="bfloat16", kv_cache_dtype="fp8"))
    scales = [(layer.self_attn.k_scale, layer.self_attn.v_scale) for layer in engine.model.layers]
    assert [(k.item(), v.item()) for k, v in scales] == [(0.5, 0.25), (2.0, 4.0)]
    assert all(k.dtype == v.dtype == torch.float32 and k.shape == () for k, v in scales)


def test_cache_holds_keys_and_values_divided_by_their_scales(tiny_checkpoint):
    """Layer 0's K/V come from the embeddings alone, so the unquantized engine's cache is what the FP8 one holds."""
    engines = [WorkerEngine.load(WorkerConfig(model=str(tiny_checkpoint), kv_cache_dtype=kv_cache_dtype))
               for kv_cache_dtype in ("auto", "fp8")]
    for engine in engines:
        run_greedy(engine, [PROMPT], 1, chunk=1000)
    (exact_k, exact_v), (fp8_k, fp8_v) = (engine.runner.kv_caches[0] for engine in engines)
    assert fp8_k.dtype == fp8_v.dtype == FP8 and exact_k.dtype == torch.float32
    written = slice(0, 2)  # the prompt's 37 tokens fill blocks 0, 1 and 2 in part
    for exact, stored, scale in ((exact_k, fp8_k, 0.5), (exact_v, fp8_v, 0.25)):
        assert exact[written].abs().max() > 4  # some values need the scale to keep their precision
        torch.testing.assert_close(stored[written].float(), (exact[written] / scale).to(FP8).float())


def test_fp8_pool_holds_twice_the_blocks_of_bf16():
    num_blocks = {}
    for kv_cache_dtype in ("auto", "fp8"):
        engine = WorkerEngine.load(WorkerConfig(model="SmolLM2-135M", load_format="dummy", dtype="bfloat16",
                                                kv_cache_dtype=kv_cache_dtype, kv_cache_gib=1 / 16))
        num_blocks[kv_cache_dtype] = engine.init_cache(16)
        assert {cache.dtype for pair in engine.runner.kv_caches for cache in pair} == \
            {torch.bfloat16 if kv_cache_dtype == "auto" else FP8}
    # SmolLM2: 30 layers x 3 KV heads x 64 dims x (K, V) x 16 tokens = 368,640 bf16 bytes a block
    assert num_blocks == {"auto": (64 << 20) // 368_640, "fp8": (64 << 20) // 184_320}


@pytest.mark.parametrize("config, error", [
    (dict(kernels="triton"), "Triton interpreter rounds FP8 stores wrongly"),
    (dict(device="meta"), "neither the CPU nor CUDA"),
], ids=["interpreter", "other_device"])
def test_unsupported_paths_fail_at_start(config, error):
    with pytest.raises(RuntimeError, match=error):
        WorkerEngine.load(WorkerConfig(model="SmolLM2-135M", load_format="dummy", kv_cache_dtype="fp8", **config))


def test_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        WorkerConfig(model="m", kv_cache_dtype="fp8_e5m2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the memory profile and CUDA graphs need a CUDA device")
def test_gpu_profile_sizes_twice_the_blocks_and_graphs_replay_fp8():
    from sluice.cli.offline import OfflineEngine
    from sluice.core.sampling_params import SamplingParams

    num_blocks, tokens = {}, {}
    for kv_cache_dtype, enforce_eager in (("auto", True), ("fp8", True), ("fp8", False)):
        worker = WorkerEngine.load(WorkerConfig(model="Qwen3-0.6B", load_format="dummy", dtype="bfloat16",
                                                device="cuda", kv_cache_dtype=kv_cache_dtype,
                                                enforce_eager=enforce_eager, gpu_memory_utilization=0.3))
        engine = OfflineEngine(worker, max_model_len=1024, max_num_seqs=16)
        num_blocks[kv_cache_dtype] = engine.scheduler.config.num_blocks
        prompts = [list(range(7 * i + 1, 7 * i + 1 + 60 + 30 * i)) for i in range(5)]
        params = [SamplingParams(max_tokens=4 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(5)]
        tokens[kv_cache_dtype, enforce_eager] = [result.token_ids for result in engine.generate(prompts, params)]
        del engine, worker
        torch.cuda.empty_cache()
    assert 1.9 < num_blocks["fp8"] / num_blocks["auto"] < 2.1
    assert tokens["fp8", False] == tokens["fp8", True]  # decode graphs captured over the FP8 cache replay it


def test_one_kv_scale_serves_keys_and_values():
    """AutoFP8's first layout: self_attn.kv_scale, for both; a layer without scales gets 1.0."""
    state = {"layers.0.self_attn.kv_scale": torch.tensor([0.5]), "layers.0.mlp.down_proj.weight": torch.ones(2, 2)}
    scaled = with_kv_scales(state, num_layers=2)
    assert {name: tensor.item() for name, tensor in scaled.items() if name.endswith("_scale")} == {
        "layers.0.self_attn.k_scale": 0.5, "layers.0.self_attn.v_scale": 0.5,
        "layers.1.self_attn.k_scale": 1.0, "layers.1.self_attn.v_scale": 1.0}
    assert scaled["layers.0.mlp.down_proj.weight"] is state["layers.0.mlp.down_proj.weight"]
