"""Pre-quantized FP8 folders of SmolLM2 (fp8_checkpoints.py) load without `--quantization`: per channel they are the
model that `--quantization fp8` makes of the float weights, per tensor or in blocks a close one; projections on their
ignore lists stay unquantized; their calibrated KV-cache scales reach the layers; tensor-parallel ranks read their
slices; a quantization the worker cannot run fails before any weight is read."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.fp8_checkpoint import checkpoint_quantization
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import load_checkpoint
from sluice.worker.models.shard_layout import ShardLayout
from sluice.worker.ops.fp8 import FP8, quantize_rows
from sluice.worker.ops.fp8_gemm import fp8_gemm_for
from sluice.worker.parallel.group import ReplicaGroups
from tests.worker.fp8_checkpoints import BLOCK, write_fp8_checkpoint, write_kv_cache_scales
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import prompt_logits
from tests.worker.test_fp8_accuracy import TEXT


@pytest.fixture(scope="module")
def checkpoint(default_model_dir, tmp_path_factory):
    folders = {}

    def folder(method: str, strategy: str, ignore: tuple[str, ...] = ()):
        if (method, strategy, ignore) not in folders:
            target = tmp_path_factory.mktemp("fp8") / f"{method}-{strategy}"
            folders[method, strategy, ignore] = write_fp8_checkpoint(default_model_dir, target, method, strategy,
                                                                     ignore)
        return folders[method, strategy, ignore]
    return folder


@pytest.fixture(scope="module")
def prompt_ids(hf_tokenizer):
    return hf_tokenizer(TEXT).input_ids


@pytest.fixture(scope="module")
def quantized_at_load(default_model_dir, prompt_ids):
    return prompt_logits(WorkerEngine.load(WorkerConfig(model=str(default_model_dir), quantization="fp8")), prompt_ids)


@pytest.mark.parametrize("method, quantization", [("fp8", "auto"), ("compressed-tensors", "auto"),
                                                  ("compressed-tensors", "fp8"), ("modelopt", "auto")])
def test_per_channel_checkpoints_are_the_model_quantized_at_load(checkpoint, prompt_ids, quantized_at_load, method,
                                                                 quantization):
    engine = WorkerEngine.load(WorkerConfig(model=str(checkpoint(method, "channel")), quantization=quantization))
    assert engine.model_config.quantization == "fp8"
    assert engine.model.layers[0].self_attn.qkv_proj.weight.dtype == FP8
    assert torch.equal(prompt_logits(engine, prompt_ids), quantized_at_load)


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors", "modelopt"])
def test_per_tensor_checkpoints_stay_close(checkpoint, prompt_ids, quantized_at_load, method):
    """Measured on this text: mean KL 0.155 to the per-channel model, the same argmax at 86% of positions."""
    engine = WorkerEngine.load(WorkerConfig(model=str(checkpoint(method, "tensor"))))
    qkv = engine.model.layers[0].self_attn.qkv_proj
    q_size = engine.model_config.num_heads * engine.model_config.head_dim
    assert qkv.weight_scale.shape == (qkv.weight.shape[0],) and qkv.weight_scale[:q_size].unique().numel() == 1
    logits = prompt_logits(engine, prompt_ids)
    kl = F.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(quantized_at_load, -1), log_target=True,
                  reduction="none").sum(-1)
    assert 0 < kl.mean() < 0.25
    assert (logits.argmax(-1) == quantized_at_load.argmax(-1)).float().mean() >= 0.8


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors"])
def test_block_wise_checkpoints_run_quantized_again_per_channel(checkpoint, prompt_ids, quantized_at_load, method):
    """Qwen's and DeepSeek's layout (128 x 128 blocks; SmolLM2's 576 and 1,536 leave cut blocks at the edges): each
    weight dequantized with its blocks' scales, then quantized per output channel; the logits stay about as close to
    the float weights quantized per channel as a per-tensor checkpoint's (measured: mean KL 0.159; per tensor 0.155)."""
    folder = checkpoint(method, "block")
    stored = load_file(folder / "model.safetensors")
    scale_suffix = "_scale_inv" if method == "fp8" else "_scale"
    dequantized = torch.cat([_dequantized_blocks(stored[f"model.layers.0.self_attn.{part}.weight"],
                                                 stored[f"model.layers.0.self_attn.{part}.weight{scale_suffix}"])
                             for part in ("q_proj", "k_proj", "v_proj")])
    engine = WorkerEngine.load(WorkerConfig(model=str(folder)))
    qkv = engine.model.layers[0].self_attn.qkv_proj
    expected_weight, expected_scale = quantize_rows(dequantized)
    assert torch.equal(qkv.weight.view(torch.uint8), expected_weight.view(torch.uint8))
    assert torch.equal(qkv.weight_scale, expected_scale)
    kl = F.kl_div(torch.log_softmax(prompt_logits(engine, prompt_ids), -1), torch.log_softmax(quantized_at_load, -1),
                  log_target=True, reduction="none").sum(-1)
    assert 0 < kl.mean() < 0.25


def _dequantized_blocks(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight's e4m3 values times the scale of the BLOCK each lies in."""
    rows, columns = weight.shape
    row_block = torch.arange(rows) // BLOCK[0]
    column_block = torch.arange(columns) // BLOCK[1]
    return weight.float() * scale[row_block[:, None], column_block[None, :]]


LAYER_0_IGNORED = tuple(f"model.layers.0.{name}" for name in
                        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"))


@pytest.mark.parametrize("method, quantization", [("fp8", "auto"), ("compressed-tensors", "fp8"),
                                                  ("fbgemm_fp8", "auto")])
def test_ignored_projections_keep_their_float_weights(default_model_dir, checkpoint, prompt_ids, quantized_at_load,
                                                      method, quantization):
    """Layer 0's qkv and down projections, on the checkpoint's ignore list, run unquantized (also under
    `--quantization fp8`), which brings the logits closer to the float model's than the fully quantized model's
    under the same activation bound (measured on this text: mean KL 0.073 against 0.090; fbgemm_fp8's bound, 1200,
    0.136 against 0.148)."""
    engine = WorkerEngine.load(WorkerConfig(model=str(checkpoint(method, "channel", LAYER_0_IGNORED)),
                                            quantization=quantization))
    float_engine = WorkerEngine.load(WorkerConfig(model=str(default_model_dir)))
    for layer, float_layer in zip(engine.model.layers[:2], float_engine.model.layers[:2]):
        projections = {"qkv": (layer.self_attn.qkv_proj, float_layer.self_attn.qkv_proj),
                       "gate_up": (layer.mlp.gate_up_proj, float_layer.mlp.gate_up_proj),
                       "down": (layer.mlp.down_proj, float_layer.mlp.down_proj)}
        for name, (projection, float_projection) in projections.items():
            if layer is engine.model.layers[0] and name != "gate_up":
                assert not hasattr(projection, "weight_scale")
                assert torch.equal(projection.weight, float_projection.weight)
            else:
                assert projection.weight.dtype == FP8
    logits, float_logits = prompt_logits(engine, prompt_ids), prompt_logits(float_engine, prompt_ids)

    def kl_to_float(x: torch.Tensor) -> float:
        return F.kl_div(torch.log_softmax(x, -1), torch.log_softmax(float_logits, -1), log_target=True,
                        reduction="none").sum(-1).mean().item()
    fully_quantized = _quantized_at_load_under(engine.model_config.activation_absmax_bound, default_model_dir,
                                               prompt_ids)
    assert kl_to_float(logits) < kl_to_float(fully_quantized)


def _quantized_at_load_under(absmax_bound: float | None, model_dir, prompt_ids: list[int]) -> torch.Tensor:
    """The logits of the model quantized at load, its activations' absolute maxima clipped to absmax_bound."""
    config = WorkerConfig(model=str(model_dir), quantization="fp8")
    loaded = ModelLoader(config).load()
    loaded.ops.fp8_gemm = fp8_gemm_for(torch.device(config.device), absmax_bound=absmax_bound)
    return prompt_logits(WorkerEngine(config, loaded), prompt_ids)


def test_fbgemm_checkpoints_clip_each_token_at_their_activation_scale_ub(default_model_dir, checkpoint, prompt_ids,
                                                                        quantized_at_load):
    """Meta's bound, 1200, clips the first token of the passage in two down projections of SmolLM2 (2,555 and 2,248):
    those tokens' scales map 1200 to e4m3's largest value and their larger elements saturate. Otherwise the
    checkpoint is the model quantized at load, bit for bit."""
    config = WorkerConfig(model=str(checkpoint("fbgemm_fp8", "channel")))
    loaded = ModelLoader(config).load()
    engine = WorkerEngine(config, loaded)
    assert engine.model_config.activation_absmax_bound == 1200.0
    calls, gemm = [], loaded.ops.fp8_gemm

    def recorded_gemm(x, weight, weight_scale, bias):
        calls.append((x, weight, weight_scale, gemm(x, weight, weight_scale, bias)))
        return calls[-1][-1]
    loaded.ops.fp8_gemm = recorded_gemm
    logits = prompt_logits(engine, prompt_ids)
    clipped = [call for call in calls if call[0].abs().max() > 1200]
    assert len(calls) == 4 * engine.model_config.num_layers and clipped
    for x, weight, weight_scale, y in clipped:
        scale = x.float().abs().amax(-1, keepdim=True).clamp_max(1200.0) / 448
        x_clipped = (x.float() / scale).clamp(-448, 448).to(FP8).float() * scale
        expected = F.linear(x_clipped, weight.float() * weight_scale[:, None]).to(y.dtype)
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-3)
    assert not torch.equal(logits, quantized_at_load)
    assert torch.equal(_quantized_at_load_under(1200.0, default_model_dir, prompt_ids), logits)


def test_a_fused_projection_stored_in_two_precisions_fails_naming_them(checkpoint):
    folder = checkpoint("compressed-tensors", "channel", ("model.layers.0.self_attn.k_proj",))
    stored = r"layers\.0\.self_attn\.q_proj in torch\.float8_e4m3fn, layers\.0\.self_attn\.k_proj in torch\.float32"
    with pytest.raises(ValueError, match=f"must share a precision; the checkpoint stores {stored}"):
        WorkerEngine.load(WorkerConfig(model=str(folder)))


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors", "modelopt", None])
def test_calibrated_kv_cache_scales_reach_the_layers(default_model_dir, tmp_path, prompt_ids, method):
    """AutoFP8's, ModelOpt's and llm-compressor's calibrated KV caches, the last also over float weights (method
    None): the layers store with the checkpoint's scales under `--kv-cache-dtype fp8`, and the logits stay close to
    those of the same weights over a cache in the model dtype (measured: mean KL 0.090 over FP8 weights, 0.014 over
    float ones; with scales of 1.0, 0.080 and 0.015)."""
    if method is None:
        folder = shutil.copytree(default_model_dir, tmp_path / "float", ignore=shutil.ignore_patterns("*.gguf"))
    else:
        folder = write_fp8_checkpoint(default_model_dir, tmp_path / method, method, "channel")
    write_kv_cache_scales(folder, k_scale=0.25, v_scale=0.125)
    engine = WorkerEngine.load(WorkerConfig(model=str(folder), kv_cache_dtype="fp8"))
    assert engine.kv_cache_dtype == FP8
    assert engine.model_config.quantization == (method and "fp8")
    assert all((layer.self_attn.k_scale.item(), layer.self_attn.v_scale.item()) == (0.25, 0.125)
               for layer in engine.model.layers)
    logits = prompt_logits(engine, prompt_ids)
    expected = prompt_logits(WorkerEngine.load(WorkerConfig(model=str(folder))), prompt_ids)
    kl = F.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(expected, -1), log_target=True,
                  reduction="none").sum(-1)
    assert 0 < kl.mean() < 0.15


def _rows_of(layout: ShardLayout, fused: str) -> torch.Tensor:
    """The whole model's rows of a fused column-parallel projection that the rank's shard holds, in its order."""
    config = layout.config
    if fused == "qkv_proj":
        q_size, kv_size = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        q = torch.arange(layout.q_heads.start * config.head_dim, layout.q_heads.stop * config.head_dim)
        kv = torch.arange(layout.kv_heads.start * config.head_dim, layout.kv_heads.stop * config.head_dim)
        return torch.cat([q, q_size + kv, q_size + kv_size + kv])
    intermediate = torch.arange(layout.intermediate.start, layout.intermediate.stop)
    return torch.cat([intermediate, config.intermediate_size + intermediate])


def _assert_shard_of_whole(layout: ShardLayout, shard: dict[str, torch.Tensor], whole: dict[str, torch.Tensor]):
    """Column-parallel: the whole weight's rows and their scales; row-parallel: its columns and the whole scale."""
    config = layout.config
    columns = {"self_attn.o_proj": slice(layout.q_heads.start * config.head_dim, layout.q_heads.stop * config.head_dim),
               "mlp.down_proj": slice(layout.intermediate.start, layout.intermediate.stop)}
    for layer in range(config.num_layers):
        for fused in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
            name, rows = f"layers.{layer}.{fused}", _rows_of(layout, fused.split(".")[1])
            assert torch.equal(shard[f"{name}.weight"].view(torch.uint8),
                               whole[f"{name}.weight"][rows].view(torch.uint8))
            assert torch.equal(shard[f"{name}.weight_scale"], whole[f"{name}.weight_scale"][rows])
        for projection, part in columns.items():
            name = f"layers.{layer}.{projection}"
            assert torch.equal(shard[f"{name}.weight"].view(torch.uint8),
                               whole[f"{name}.weight"][:, part].view(torch.uint8))
            assert torch.equal(shard[f"{name}.weight_scale"], whole[f"{name}.weight_scale"])


@pytest.mark.parametrize("method, strategy", [("fp8", "channel"), ("compressed-tensors", "tensor"), ("fp8", "block")])
def test_each_rank_reads_the_whole_models_slices(checkpoint, method, strategy):
    """tp 3: per-channel scales ([out]) are sliced with the rows, per-tensor ones ([1]) are read whole by every
    rank, and block-wise weights are quantized again per channel whole, then sliced."""
    folder = checkpoint(method, strategy)
    config, whole = load_checkpoint(folder)
    for rank in range(3):
        _, shard = load_checkpoint(folder, rank, 3)
        _assert_shard_of_whole(ShardLayout(config, rank, 3), shard, whole)


def _check_rank_logits(group, folder, prompt: list[int], expected: torch.Tensor) -> None:
    logits = prompt_logits(WorkerEngine.load(WorkerConfig(model=str(folder)), ReplicaGroups(group, None)), prompt)
    if group.is_driver:
        kl = F.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(expected, -1), log_target=True,
                      reduction="none").sum(-1)
        assert kl.mean() < 0.1
        assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.8


def test_tensor_parallel_logits_stay_close_to_one_rank(checkpoint, prompt_ids):
    """A real gloo group of 3 ranks serving a per-tensor folder. Its logits differ from tp 1's only as far as the
    row-parallel o and down projections quantize each token's activations over the rank's columns, with a scale of
    their own (measured: mean KL 0.049, the same argmax at 86% of positions)."""
    folder = checkpoint("compressed-tensors", "tensor")
    expected = prompt_logits(WorkerEngine.load(WorkerConfig(model=str(folder))), prompt_ids)
    run_on_ranks(_check_rank_logits, 3, folder, prompt_ids, expected)


@pytest.mark.parametrize("quantization_config, named", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128]},
     r"fp8 weight_block_size \[128\]"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "gptq with 3-bit weights"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": -1.0}, "fbgemm_fp8 activation_scale_ub -1.0"),
    ({"quant_method": "awq", "bits": 4, "version": "gemv_fast"},
     r"awq version 'gemv_fast' \(only the GEMM packing loads\)"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method 'bitsandbytes'"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt quant_algo 'NVFP4'"),
    ({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"},
     "modelopt kv_cache_quant_algo 'NVFP4', kv_cache_scheme None"),
    ({"quant_method": "compressed-tensors", "config_groups": {}, "kv_cache_scheme": {
        "num_bits": 8, "type": "float", "strategy": "attn_head", "symmetric": True, "dynamic": False}},
     r"compressed-tensors with kv_cache_scheme \{'num_bits': 8, 'type': 'float', 'strategy': 'attn_head', .*\}"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "group", "group_size": 128}}}},
     r"compressed-tensors \(group group_0\) with 8-bit weights"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128}}}},
     r"compressed-tensors weights num_bits 8, type 'float', strategy 'group' \(group group_0\)"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}},
     r"compressed-tensors block_structure \(group group_0\) None"),
])
def test_unsupported_quantization_fails_naming_it(default_model_dir, tmp_path, quantization_config, named):
    """The folder has no weights: the error comes from config.json, before any is read, and `--quantization fp8`
    does not override the checkpoint's method."""
    hf_config = json.loads((default_model_dir / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf_config, "quantization_config": quantization_config}))
    with pytest.raises(ValueError, match=f"checkpoint quantization {named} is not supported"):
        WorkerEngine.load(WorkerConfig(model=str(tmp_path), quantization="fp8"))


def test_modelopt_config_in_config_json_is_read_as_its_legacy_file():
    """Newer ModelOpt exports write quantization_config into config.json, with a kv_cache_scheme."""
    quantization = {"quant_method": "modelopt", "quant_algo": "fp8", "ignore": ["lm_head"],
                    "kv_cache_scheme": {"num_bits": 8, "type": "float", "dynamic": False}}
    assert checkpoint_quantization({"quantization_config": quantization}) == "fp8"
    with pytest.raises(ValueError, match="modelopt kv_cache_quant_algo 'FP8', kv_cache_scheme"):
        checkpoint_quantization({"quantization_config": {**quantization, "kv_cache_scheme": {"num_bits": 4}}})
