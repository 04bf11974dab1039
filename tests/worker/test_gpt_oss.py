"""gpt-oss at a tiny size with random weights and its real options (sinks, a window shorter than the prompts in every
other layer, biased attention and experts, the clamped SwiGLU, YaRN rope): token-identical to Hugging Face greedy, from
the layout transformers saves and from an MXFP4 checkpoint (dequantized at load exactly as transformers dequantizes
it), on one device and split over two ranks, on the torch operators and the Triton kernels; pre-quantized FP8
checkpoints, expert parallelism and unbiased attention refused."""
import dataclasses

import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.mxfp4 import dequantize_mxfp4, dequantized_projection
from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.shard_layout import ShardLayout
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import run_greedy

TINY_GPT_OSS = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "eos_token_id": 0, "pad_token_id": 255,
    "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 6, "rope_theta": 10000.0,
    "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 128, "rope_theta": 10000.0},
}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
PROMPTS = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]
_PROJECTIONS = ("gate_up_proj", "down_proj")


def gpt_oss_state(hf_config: dict = TINY_GPT_OSS, scale: float = 10) -> dict[str, torch.Tensor]:
    """Random weights scaled for lively outputs: routing far from ties, sinks that weigh in each softmax, gates and
    ups past the SwiGLU's clamp. scale: the weights' (but the norms' and the sinks'), over random_state_dict's."""
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=1)
    state = {name: t if name.endswith("norm.weight") else t * scale for name, t in state.items()}
    generator = torch.Generator().manual_seed(2)
    for name in state:
        if name.endswith("sinks"):
            state[name] = torch.randn(state[name].shape, generator=generator) * 3
        if name.endswith("gate_up_proj"):
            state[name] *= 4
    return state


def random_mxfp4(shape: tuple[int, ...], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks [..., rows, groups, 16] and scales [..., rows, groups] of a [..., rows, groups * 32] weight."""
    blocks = torch.randint(0, 256, (*shape[:-1], shape[-1] // 32, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(123, 128, (*shape[:-1], shape[-1] // 32), dtype=torch.uint8, generator=generator)
    return blocks, scales


def mxfp4_checkpoint(state: dict[str, torch.Tensor]) -> tuple[dict, dict]:
    """(the MXFP4 tensors of a checkpoint, the same model's weights as transformers dequantizes them): the experts'
    projections replaced by random blocks and scales."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(3)
    packed, dequantized = dict(state), dict(state)
    for name in [name for name in state if name.endswith(_PROJECTIONS)]:
        experts, columns, rows = state[name].shape  # transformers' layout: [experts, in, out]
        blocks, scales = random_mxfp4((experts, rows, columns), generator)
        del packed[name]
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dequantized[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    return packed, dequantized


def _hf_model(hf_config: dict, state: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config), dtype=torch.float32).eval()
    model.load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """{layout: (checkpoint folder, Hugging Face's model of the same weights)}, for transformers' own layout and
    for MXFP4 experts."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    state = gpt_oss_state()
    packed, dequantized = mxfp4_checkpoint(state)
    built = {}
    for layout, tensors, hf_state, quantization in (("unquantized", state, state, None),
                                                      ("mxfp4", packed, dequantized, MXFP4)):
        folder = tmp_path_factory.mktemp(layout)
        save_file(tensors, folder / "model.safetensors")
        quantized = {"quantization_config": quantization} if quantization else {}
        AutoConfig.for_model(**TINY_GPT_OSS, **quantized).save_pretrained(folder)
        built[layout] = folder, _hf_model(TINY_GPT_OSS, hf_state)
    return built


def _engine(folder, worker_config: WorkerConfig, group=None) -> WorkerEngine:
    rank, world_size = (0, 1) if group is None else (group.rank, group.world_size)
    checkpoint = load_checkpoint(folder, rank, world_size)
    return WorkerEngine(worker_config, ModelLoader(worker_config, group).build(*checkpoint), group)


def test_mxfp4_dequantizes_as_transformers(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=generator)
    scales = torch.randint(0, 256, (3, 10, 4), dtype=torch.uint8, generator=generator)  # every e8m0 exponent
    for dtype in (torch.bfloat16, torch.float32):
        expected = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # [experts, columns, rows]
        torch.testing.assert_close(dequantized_projection(blocks, scales).to(dtype), expected, rtol=0, atol=0,
                                   equal_nan=True)
        torch.testing.assert_close(dequantize_mxfp4(blocks, scales, dtype), expected.transpose(1, 2), rtol=0, atol=0,
                                   equal_nan=True)


@pytest.mark.parametrize("layout, kernels", [("unquantized", "torch"), ("mxfp4", "torch"), ("mxfp4", "triton")])
def test_gpt_oss_matches_hf(checkpoints, layout, kernels):
    """kernels triton: the attention kernels' sinks and windows, the fused MoE kernels' biases and clamped SwiGLU."""
    folder, hf = checkpoints[layout]
    expected = [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    for batch in (PROMPTS, PROMPTS[2:]):
        engine = _engine(folder, WorkerConfig(model="gpt-oss", kernels=kernels))
        assert run_greedy(engine, batch, 12, chunk=5) == expected[len(PROMPTS) - len(batch):]


def test_options_are_read_as_transformers_reads_them(checkpoints):
    config = load_checkpoint(checkpoints["mxfp4"][0])[0]
    assert config.layer_windows == (6, 0, 6) and config.quantization is None
    assert config.rope_scaling["rope_type"] == "yarn" and config.moe.clamped_swiglu.limit == 7.0
    shape = ModelConfig.from_hf(shape_config("gpt-oss-20b"))
    assert shape.layer_windows == (128, 0) * 12 and (shape.moe.num_experts, shape.moe.top_k) == (32, 4)


def _check_sharded_rank(group, checkpoints: dict) -> None:
    for layout, (folder, _) in sorted(checkpoints.items()):
        whole = _engine(folder, WorkerConfig(model="gpt-oss"))
        sharded = _engine(folder, WorkerConfig(model="gpt-oss"), group)
        assert sharded.model.layers[0].self_attn.sinks.shape == (2,)
        expected = run_greedy(whole, PROMPTS, 8, chunk=5)
        got = run_greedy(sharded, PROMPTS, 8, chunk=5)
        assert got == (expected if group.is_driver else [[]] * len(PROMPTS)), layout


def test_sharded_gpt_oss_matches_the_whole_model(checkpoints):
    run_on_ranks(_check_sharded_rank, 2, {layout: (folder, None) for layout, (folder, _) in checkpoints.items()})


def test_fp8_checkpoints_expert_parallelism_and_unbiased_attention_are_refused():
    """A pre-quantized FP8 checkpoint (its stacked experts' layout unread; `--quantization fp8` quantizes gpt-oss at
    load, test_gpt_oss_fp8.py)."""
    config = ModelConfig.from_hf(TINY_GPT_OSS)
    state = to_worker_layout(gpt_oss_state(), config)
    with pytest.raises(ValueError, match="a pre-quantized FP8 checkpoint of GptOssForCausalLM is not supported"):
        ModelLoader(WorkerConfig(model="gpt-oss")).build(dataclasses.replace(config, quantization="fp8"), state)
    with pytest.raises(ValueError, match="expert parallelism is not implemented for GptOssForCausalLM"):
        ShardLayout(config, 0, 2, expert_parallel=True)
    with pytest.raises(ValueError, match="GptOssForCausalLM: config.json sets attention_bias = False"):
        ModelConfig.from_hf({**TINY_GPT_OSS, "attention_bias": False})
