"""4-bit mixtures of experts (tiny Qwen3-MoE and Mixtral in each format, Qwen2-MoE with its shared expert and OLMoE in
one, their experts quantized each on its own, with and without act-order, and their routers unquantized, as GPTQ, AWQ
and compressed-tensors checkpoints publish them) give the greedy tokens of transformers running the same model
dequantized in float32: alone, as a tensor-parallel group of 2 ranks (each expert's intermediate columns split in whole
groups, or with act-order as runs of down's inputs naming their groups, or whole experts on each rank) and on the
Triton kernels. A split that cuts a group fails at start, named;
dummy 4-bit experts are the dummy experts rounded to nearest."""
import dataclasses
import json

import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_w4a16 import as_dummy_w4a16
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.w4a16 import W4A16ExpertWeights, W4A16Linear
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import run_greedy
from tests.worker.test_moe_families import MOE_FAMILIES, TINY_MOE
from tests.worker.w4a16_checkpoints import Variant, write_w4a16_checkpoint

PROMPTS = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]
MAX_NEW_TOKENS = 8


def _as_saved(hf_config: dict) -> dict:
    """The config as transformers saves it (each family's defaults written out: Mixtral's rope_theta among them)."""
    from transformers import AutoConfig

    return json.loads(AutoConfig.for_model(**hf_config).to_json_string())


# every intermediate size splits over 2 ranks in whole groups of 32
FAMILIES = {"qwen3-moe": _as_saved({**TINY_MOE, **MOE_FAMILIES["qwen3-moe"], "intermediate_size": 128,
                                    "moe_intermediate_size": 64}),
            "mixtral": _as_saved({**TINY_MOE, **MOE_FAMILIES["mixtral"], "intermediate_size": 64}),
            "qwen2-moe": _as_saved({**TINY_MOE, **MOE_FAMILIES["qwen2-moe"], "intermediate_size": 64,
                                    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64}),
            "olmoe": _as_saved({**TINY_MOE, **MOE_FAMILIES["olmoe"], "intermediate_size": 64})}
VARIANTS = {"gptq": Variant("gptq", group=32), "awq": Variant("awq", group=32, sym=False),
            "ct": Variant("compressed-tensors", group=32, sym=False),
            "gptq-desc-act": Variant("gptq", group=32, sym=False, act_order=True),
            "ct-actorder": Variant("compressed-tensors", group=32, act_order=True)}
CHECKPOINTS = [(family, variant) for family in ("qwen3-moe", "mixtral") for variant in ("gptq", "awq", "ct")] + [
    ("qwen2-moe", "awq"), ("olmoe", "gptq"), ("qwen3-moe", "gptq-desc-act"), ("mixtral", "gptq-desc-act"),
    ("qwen3-moe", "ct-actorder")]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """{(family, variant): (4-bit folder, transformers' greedy tokens of its dequantized copy)}"""
    from transformers import AutoModelForCausalLM

    folders = {}
    for family, variant in CHECKPOINTS:
        quantized, dequantized = write_w4a16_checkpoint(tmp_path_factory.mktemp(f"{family}-{variant}"),
                                                        VARIANTS[variant], FAMILIES[family])
        hf = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
        with torch.inference_mode():
            tokens = [hf.generate(torch.tensor([p]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
        folders[family, variant] = quantized, tokens
    return folders


@pytest.mark.parametrize("family, variant", CHECKPOINTS)
def test_4bit_mixture_is_its_dequantized_model(checkpoints, family, variant):
    folder, expected = checkpoints[family, variant]
    engine = WorkerEngine.load(WorkerConfig(model=str(folder)))
    assert engine.model_config.quantization == VARIANTS[variant].method
    moe = engine.model.layers[engine.model_config.moe.sparse_layers[0]].mlp
    assert isinstance(moe.experts.w13, W4A16ExpertWeights) and isinstance(moe.experts.w2, W4A16ExpertWeights)
    assert (moe.experts.w13.perm is not None) == (moe.experts.w2.perm is not None) == VARIANTS[variant].act_order
    assert not isinstance(moe.gate, W4A16Linear) and isinstance(engine.model.layers[0].self_attn.qkv_proj, W4A16Linear)
    assert run_greedy(engine, PROMPTS, MAX_NEW_TOKENS, chunk=5) == expected


def _greedy_on_rank(group, runs: list) -> None:
    for folder, expert_parallel, expected in runs:
        config = WorkerConfig(model=str(folder), enable_expert_parallel=expert_parallel)
        checkpoint = load_checkpoint(folder, group.rank, 2, expert_parallel)
        engine = WorkerEngine(config, ModelLoader(config, group).build(*checkpoint), group)
        outputs = run_greedy(engine, PROMPTS, MAX_NEW_TOKENS, chunk=5)
        if group.rank == 0:
            assert outputs == expected, folder


def test_rank_group_gives_the_whole_models_tokens(checkpoints):
    runs = [(folder, False, tokens) for folder, tokens in checkpoints.values()]
    runs.append((*checkpoints["qwen3-moe", "awq"][:1], True, checkpoints["qwen3-moe", "awq"][1]))
    run_on_ranks(_greedy_on_rank, 2, runs)


def test_experts_shard_in_whole_groups(checkpoints):
    """Rank 1 holds each expert's intermediate columns 32-63: gate and up's second halves, down's second group."""
    folder = checkpoints["qwen3-moe", "gptq"][0]
    whole, rank1 = load_checkpoint(folder)[1], load_checkpoint(folder, 1, 2)[1]
    experts = "layers.0.mlp.experts."
    assert rank1[f"{experts}w13.qweight"].shape == (8, 64 // 8, 64)
    torch.testing.assert_close(rank1[f"{experts}w13.scales"][:, :, :32], whole[f"{experts}w13.scales"][:, :, 32:64])
    assert torch.equal(rank1[f"{experts}w2.qweight"], whole[f"{experts}w2.qweight"][:, 4:])


def test_act_order_experts_shard_downs_inputs_naming_their_groups(checkpoints):
    """Rank 1 holds each expert's intermediate columns 32-63: gate and up rows sorted by group, down's inputs in their
    own order, each naming its group among all of the expert's."""
    rank1 = load_checkpoint(checkpoints["qwen3-moe", "gptq-desc-act"][0], 1, 2)[1]
    experts = "layers.0.mlp.experts."
    assert rank1[f"{experts}w13.perm"].shape == (8, 64) and f"{experts}w13.group_index" not in rank1
    assert rank1[f"{experts}w2.group_index"].shape == (8, 32) and f"{experts}w2.perm" not in rank1
    assert rank1[f"{experts}w2.scales"].shape == (8, 64 // 32, 64)


@pytest.mark.parametrize("family, variant", [("qwen3-moe", "awq"), ("mixtral", "gptq"), ("mixtral", "gptq-desc-act")])
def test_triton_operators_give_the_torch_operators_tokens(checkpoints, family, variant):
    """The fused MoE kernels over 4-bit experts (the interpreter, on the CPU): with zero points, symmetric, and
    act-order."""
    folder = str(checkpoints[family, variant][0])
    expected = run_greedy(WorkerEngine.load(WorkerConfig(model=folder)), PROMPTS[:2], 3, chunk=5)
    engine = WorkerEngine.load(WorkerConfig(model=folder, kernels="triton", enforce_eager=True))
    assert run_greedy(engine, PROMPTS[:2], 3, chunk=5) == expected


def test_a_split_that_cuts_an_experts_groups_fails_naming_it(tmp_path):
    """Groups of 32 over an expert's 96 intermediate columns: each of 2 ranks would hold one and a half."""
    hf_config = {**FAMILIES["qwen3-moe"], "moe_intermediate_size": 96}
    folder, _ = write_w4a16_checkpoint(tmp_path, Variant("gptq", group=32), hf_config)
    with pytest.raises(ValueError, match=r"rank 0 of 2 would hold inputs 0-48 of model\.layers\.0\.mlp\.experts\.0"
                                         r"\.down_proj's 96, which cuts its 4-bit weight's groups of 32"):
        load_checkpoint(folder, 0, 2)
    assert load_checkpoint(folder, 0, 2, expert_parallel=True)[1]["layers.0.mlp.experts.w2.qweight"].shape[0] == 4


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_dummy_4bit_experts_are_the_dummy_experts_rounded_to_nearest(method):
    from sluice.kernels.w4a16_layout import dequantize_stack

    hf_config = FAMILIES["qwen3-moe"]
    config = ModelConfig.from_hf(hf_config)
    unquantized = to_worker_layout(random_state_dict(hf_config, torch.float32, torch.device("cpu"), 0), config)
    state = as_dummy_w4a16(dict(unquantized), method)
    for part in ("w13", "w2"):
        name = f"layers.0.mlp.experts.{part}"
        stacked = W4A16ExpertWeights(*unquantized[name].shape[:1], unquantized[name].shape[2],
                                     unquantized[name].shape[1], 1, method == "awq", False)
        stacked.load_state_dict({kind: state[f"{name}.{kind}"] for kind in ("qweight", "scales", "zeros")
                                 if f"{name}.{kind}" in state})
        half_step = stacked.scales.transpose(1, 2) / 2  # one group a row: hidden 64 and intermediate 64
        assert ((dequantize_stack(stacked.w4a16) - unquantized[name]).abs() <= half_step + 1e-6).all()
    quantized = dataclasses.replace(config, quantization=method)
    engine = WorkerEngine(WorkerConfig(model="qwen3-moe"), ModelLoader(WorkerConfig(model="qwen3-moe")).build(
        quantized, state))
    assert len(run_greedy(engine, PROMPTS[:1], 2, chunk=5)[0]) == 2
