"""4-bit checkpoints (GPTQ symmetric and with zero points, with and without act-order, v1 and v2 zero points; AWQ;
compressed-tensors in groups, with actorder and per channel) load without `--quantization`, report their method and
give the logits and greedy tokens of transformers running the same model dequantized in float32, alone and as a
tensor-parallel group of 2 ranks (each converting its slice once; act-order's row-parallel projections as runs of
inputs naming their groups); a projection on the ignore list stays as stored; variants the worker cannot run fail at
start, named."""
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.w4a16_checkpoint import LAYOUT_TENSORS
from sluice.worker.loading.weights import load_checkpoint
from sluice.worker.ops.w4a16 import W4A16Linear
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import prompt_logits, run_greedy
from tests.worker.w4a16_checkpoints import TINY_LLAMA, Variant, write_w4a16_checkpoint

PROMPTS = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]
MAX_NEW_TOKENS = 10
VARIANTS = {
    "gptq-sym": Variant("gptq"),
    "gptq-asym": Variant("gptq", sym=False, ignore=("model.layers.1.mlp.down_proj",)),
    "gptq-sym-desc-act": Variant("gptq", act_order=True),
    "gptq-v2-asym-desc-act": Variant("gptq", group=32, sym=False, act_order=True, gptq_v2=True),
    "gptq-per-channel": Variant("gptq", group=None, sym=False),
    "awq": Variant("awq", sym=False, ignore=("model.layers.0.self_attn.o_proj",)),
    "ct-group": Variant("compressed-tensors"),
    "ct-group-actorder": Variant("compressed-tensors", sym=False, act_order=True),
    "ct-channel": Variant("compressed-tensors", group=None, sym=False),
}
SHARDED = ("gptq-asym", "gptq-v2-asym-desc-act", "awq", "ct-group", "ct-group-actorder", "ct-channel")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """{variant: (4-bit folder, transformers' float32 model of its dequantized copy)}"""
    from transformers import AutoModelForCausalLM

    folders = {}
    for name, variant in VARIANTS.items():
        quantized, dequantized = write_w4a16_checkpoint(tmp_path_factory.mktemp(name), variant)
        folders[name] = quantized, AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    return folders


def hf_tokens(hf, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        output = hf.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return output[0, len(prompt):].tolist()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_checkpoint_is_its_dequantized_model(checkpoints, name):
    folder, hf = checkpoints[name]
    variant = VARIANTS[name]
    engine = WorkerEngine.load(WorkerConfig(model=str(folder)))
    assert engine.model_config.quantization == variant.method
    layers = engine.model.layers
    assert isinstance(layers[0].self_attn.qkv_proj, W4A16Linear)
    assert (layers[0].self_attn.qkv_proj.perm is not None) == variant.act_order
    for ignored in variant.ignore:
        layer, module = ignored.removeprefix("model.layers.").split(".", 1)
        unquantized = layers[int(layer)].get_submodule(module)
        assert not isinstance(unquantized, W4A16Linear) and unquantized.weight.dtype == torch.float32
    with torch.inference_mode():
        expected = hf(torch.tensor([PROMPTS[2]])).logits[0]
    torch.testing.assert_close(prompt_logits(engine, PROMPTS[2]), expected, atol=1e-4, rtol=1e-4)
    assert run_greedy(engine, PROMPTS, MAX_NEW_TOKENS, chunk=5) == [hf_tokens(hf, p) for p in PROMPTS]


def _greedy_on_rank(group, folders: list, expected: list) -> None:
    for folder, tokens in zip(folders, expected):
        config = WorkerConfig(model=str(folder))
        engine = WorkerEngine(config, ModelLoader(config, group).build(*load_checkpoint(folder, group.rank, 2)),
                              group)
        outputs = run_greedy(engine, PROMPTS, MAX_NEW_TOKENS, chunk=5)
        if group.rank == 0:
            assert outputs == tokens


def test_rank_group_gives_the_whole_models_tokens(checkpoints):
    folders = [checkpoints[name][0] for name in SHARDED]
    expected = [[hf_tokens(checkpoints[name][1], p) for p in PROMPTS] for name in SHARDED]
    run_on_ranks(_greedy_on_rank, 2, folders, expected)


def test_row_parallel_shards_are_whole_groups(checkpoints):
    """Rank 1's o_proj inputs are q heads 2 and 3 (columns 64-127): its groups 1 (of 64) of the whole weight."""
    whole = load_checkpoint(checkpoints["gptq-asym"][0])[1]
    _, rank1 = load_checkpoint(checkpoints["gptq-asym"][0], 1, 2)
    assert torch.equal(rank1["layers.0.self_attn.o_proj.qweight"], whole["layers.0.self_attn.o_proj.qweight"][8:])
    assert torch.equal(rank1["layers.0.self_attn.o_proj.scales"], whole["layers.0.self_attn.o_proj.scales"][1:])
    half = TINY_LLAMA["intermediate_size"]
    assert torch.equal(rank1["layers.0.mlp.gate_up_proj.zeros"][:, :half // 2],
                       whole["layers.0.mlp.gate_up_proj.zeros"][:, half // 2:half])


def test_act_order_row_parallel_shards_name_each_rows_group(checkpoints):
    """Rank 1's o_proj of an act-order checkpoint holds inputs 64-127 in their own order, each row naming its group
    among the whole weight's (the checkpoint's g_idx), with every group's scales and zero points; its q/k/v keep their
    rows sorted by group, cut along their outputs."""
    from sluice.kernels.w4a16_layout import W4A16Weight, dequantize

    folder = checkpoints["gptq-v2-asym-desc-act"][0]
    whole, rank1 = load_checkpoint(folder)[1], load_checkpoint(folder, 1, 2)[1]
    o_proj = "layers.0.self_attn.o_proj"
    g_idx = load_file(folder / "model.safetensors")[f"model.{o_proj}.g_idx"]
    assert torch.equal(rank1[f"{o_proj}.group_index"], g_idx[64:]) and f"{o_proj}.perm" not in rank1
    assert all(torch.equal(rank1[f"{o_proj}.{kind}"], whole[f"{o_proj}.{kind}"]) for kind in ("scales", "zeros"))
    share, weight = (W4A16Weight(*(state.get(f"{o_proj}.{kind}") for kind in LAYOUT_TENSORS))
                     for state in (rank1, whole))
    assert torch.equal(dequantize(share), dequantize(weight)[:, 64:])
    assert torch.equal(rank1["layers.0.self_attn.qkv_proj.perm"], whole["layers.0.self_attn.qkv_proj.perm"])


def _with_quantization_config(source, target, **changes) -> str:
    target.mkdir()
    (target / "model.safetensors").symlink_to(source / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"].update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


@pytest.mark.parametrize("name, changes, message", [
    ("gptq-sym", {"bits": 8}, "gptq with 8-bit weights"),
    ("gptq-sym", {"group_size": 40}, "gptq with group_size 40"),
    ("gptq-sym", {"checkpoint_format": "marlin"}, "gptq checkpoint_format 'marlin'"),
    ("awq", {"version": "gemv"}, "awq version 'gemv'"),
    ("ct-group", {"format": "marlin-24"}, "compressed-tensors format 'marlin-24' (group group_0)"),
])
def test_unsupported_variants_fail_at_start(checkpoints, tmp_path, name, changes, message):
    folder = _with_quantization_config(checkpoints[name][0], tmp_path / "variant", **changes)
    with pytest.raises(ValueError, match=f"checkpoint quantization {re.escape(message)}.* is not supported"):
        WorkerEngine.load(WorkerConfig(model=folder))


def test_quantized_activations_fail_at_start(checkpoints, tmp_path):
    config = json.loads((checkpoints["ct-group"][0] / "config.json").read_text())["quantization_config"]
    group = config["config_groups"]["group_0"]
    group["input_activations"] = {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}
    folder = _with_quantization_config(checkpoints["ct-group"][0], tmp_path / "w4a8", config_groups={"group_0": group})
    with pytest.raises(ValueError, match="compressed-tensors quantized input_activations"):
        WorkerEngine.load(WorkerConfig(model=folder))


def test_a_row_parallel_split_that_cuts_groups_is_refused(checkpoints):
    """At 4 ranks, o_proj's 128 inputs (4 heads of 32) give each rank 32, half a group of 64."""
    with pytest.raises(ValueError, match="rank 0 of 4 would hold inputs 0-32 of model.layers.0.self_attn.o_proj's "
                                         "128, which cuts its 4-bit weight's groups of 64"):
        load_checkpoint(checkpoints["gptq-sym"][0], 0, 4)


def test_an_act_order_split_off_multiples_of_16_is_refused(tmp_path):
    """head_dim 24: at 4 ranks each would hold 24 of o_proj's 96 act-order inputs, cutting the kernels' K slices."""
    folder, _ = write_w4a16_checkpoint(tmp_path, Variant("gptq", group=32, act_order=True), {**TINY_LLAMA,
                                                                                           "head_dim": 24})
    with pytest.raises(ValueError, match=r"rank 0 of 4 would hold inputs 0-24 of model\.layers\.0\.self_attn\.o_proj's "
                                         "96, quantized with act-order: a rank's run of them must start and end at "
                                         "multiples of 16"):
        load_checkpoint(folder, 0, 4)


@pytest.mark.parametrize("flag, message", [("awq", "--quantization awq needs a awq checkpoint"),
                                           ("fp8", "--quantization fp8 does not quantize a 4-bit")])
def test_quantization_flag_must_name_the_checkpoints_method(checkpoints, flag, message):
    with pytest.raises(ValueError, match=message):
        WorkerEngine.load(WorkerConfig(model=str(checkpoints["gptq-sym"][0]), quantization=flag))
    engine = WorkerEngine.load(WorkerConfig(model=str(checkpoints["gptq-sym"][0]), quantization="gptq"))
    assert engine.model_config.quantization == "gptq"


def test_triton_operators_give_the_torch_operators_tokens(checkpoints):
    """TritonOps' w4a16_linear (the interpreter, on the CPU): the decode kernel for the one-token steps, the GEMM for
    the prefill chunks, act-order and zero points."""
    folder = str(checkpoints["gptq-v2-asym-desc-act"][0])
    expected = run_greedy(WorkerEngine.load(WorkerConfig(model=folder)), PROMPTS[:2], 3, chunk=5)
    engine = WorkerEngine.load(WorkerConfig(model=folder, kernels="triton", enforce_eager=True))
    assert run_greedy(engine, PROMPTS[:2], 3, chunk=5) == expected


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_dummy_weights_in_4_bits_are_the_dummy_weights_rounded_to_nearest(method):
    from sluice.kernels.w4a16_layout import dequantize

    unquantized = WorkerEngine.load(WorkerConfig(model="SmolLM2-tiny", load_format="dummy"))
    engine = WorkerEngine.load(WorkerConfig(model="SmolLM2-tiny", load_format="dummy", quantization=method))
    assert engine.model_config.quantization == method
    for name, module in engine.model.named_modules():
        if isinstance(module, W4A16Linear):
            weight = unquantized.model.get_submodule(name).weight
            group = 128 if module.in_features % 128 == 0 else module.in_features
            assert module.w4a16.group_size == group and (module.zeros is not None) == (method == "awq")
            half_step = module.scales.repeat_interleave(group, 0).T / 2
            assert ((dequantize(module.w4a16) - weight).abs() <= half_step + 1e-6).all()
    assert isinstance(engine.model.layers[0].mlp.down_proj, W4A16Linear)
