"""Gemma 2 and Gemma 3, at a tiny size with random weights: sliding-window layers (windows shorter than the longer
prompts) between global ones, Gemma 2's soft-capped attention, Gemma 3's q/k norms and its two ropes (a linearly
scaled global one, a local one of its own), soft-capped logits and query_pre_attn_scalar's attention scale. Greedy is
token-identical to Hugging Face's on one device; a rank group gives the whole model's tokens; FP8 projections and an
FP8 KV cache with scales from the first step stay near the float model."""
import pytest
import torch
import torch.nn.functional as F

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import _hf_parameter_shapes
from sluice.worker.loading.kv_scales import with_kv_scales
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.gemma import GemmaLM
from sluice.worker.models.registry import traits_for
from sluice.worker.ops.fp8 import FP8, FP8_MAX
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.runner.kv_scale_calibration import KEY_HEADROOM
from tests.worker.rank_group import run_on_ranks
from tests.worker.stepping import prompt_logits, run_greedy
from tests.worker.test_moe_families import lively_state

TINY_GEMMA = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "eos_token_id": 0, "pad_token_id": 255, "query_pre_attn_scalar": 24,
              "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
              "final_logit_softcapping": 8.0, "tie_word_embeddings": True}
GEMMA_FAMILIES = {
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attn_logit_softcapping": 4.0},
    "gemma3": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "rope_theta": 1_000_000.0,
               "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_local_base_freq": 100.0},
}
PROMPTS = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]


def gemma_config(family: str) -> dict:
    return {**TINY_GEMMA, **GEMMA_FAMILIES[family]}


def lively_gemma_state(hf_config: dict) -> dict[str, torch.Tensor]:
    """lively_state's weights but the tied embedding, as drawn: ten times louder, it would outweigh the layers in the
    residual stream, and each step would repeat its input token."""
    state = lively_state(hf_config)
    return state | {"model.embed_tokens.weight": state["model.embed_tokens.weight"] / 10}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict:
    """Each family's checkpoint folder, its config.json as transformers writes it."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    folders = {}
    for family in GEMMA_FAMILIES:
        folders[family] = tmp_path_factory.mktemp(family)
        save_file(lively_gemma_state(gemma_config(family)), folders[family] / "model.safetensors")
        AutoConfig.for_model(**gemma_config(family)).save_pretrained(folders[family])
    return folders


def _engine(folder, worker_config: WorkerConfig, group=None) -> WorkerEngine:
    rank, world_size = (0, 1) if group is None else (group.rank, group.world_size)
    return WorkerEngine(worker_config, ModelLoader(worker_config, group).build(*load_checkpoint(folder, rank,
                                                                                                world_size)), group)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("family", sorted(GEMMA_FAMILIES))
def test_gemma_matches_hf(family, kernels, checkpoints):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(checkpoints[family], dtype=torch.float32).eval()
    expected = [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
    for batch in (PROMPTS, PROMPTS[2:]):  # together, and alone
        engine = _engine(checkpoints[family], WorkerConfig(model=family, kernels=kernels))
        assert run_greedy(engine, batch, 12, chunk=5) == expected[len(PROMPTS) - len(batch):]
    with torch.inference_mode():  # the soft-capped logits themselves, as logprobs read them
        hf_logits = hf(torch.tensor([PROMPTS[2]])).logits[0]
    torch.testing.assert_close(prompt_logits(engine, PROMPTS[2]).cpu(), hf_logits, rtol=1e-5, atol=1e-5)


def test_the_layers_read_their_windows_and_ropes(checkpoints):
    config, _ = load_checkpoint(checkpoints["gemma3"])
    assert config.layer_windows == (6, 0, 6) and config.attention_scale == 24**-0.5
    assert config.rope_scaling["factor"] == 8.0 and config.sliding_rope.theta == 100.0
    assert config.sliding_rope.layers == (0, 2) and config.sliding_rope.scaling is None
    layers = _engine(checkpoints["gemma3"], WorkerConfig(model="gemma3")).model.layers
    assert [layer.rope_columns.start for layer in layers] == [16, 0, 16]


@pytest.mark.parametrize("shape", ["Gemma-2-2B", "Gemma-3-4B"])
def test_dummy_shapes_hold_the_weights_of_transformers_models_of_their_size(shape):
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = shape_config(shape)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config))
    expected = {name: tuple(t.shape) for name, t in hf.state_dict().items() if name != "lm_head.weight"}  # tied
    config = ModelConfig.from_hf(hf_config)
    assert _hf_parameter_shapes(config) == expected
    state = to_worker_layout({name: torch.empty(size, device="meta") for name, size in expected.items()}, config)
    with torch.device("meta"):
        model = GemmaLM(config, traits_for(config.architecture), TorchOps())
    assert set(model.state_dict()) == set(with_kv_scales(state, config.num_layers))


def _check_sharded_rank(group, checkpoints: dict) -> None:
    for family, folder in sorted(checkpoints.items()):
        whole = _engine(folder, WorkerConfig(model=family))
        sharded = _engine(folder, WorkerConfig(model=family), group)
        assert sharded.model.layers[0].self_attn.num_heads == 2
        expected = run_greedy(whole, PROMPTS, 8, chunk=5)
        got = run_greedy(sharded, PROMPTS, 8, chunk=5)
        assert got == (expected if group.is_driver else [[]] * len(PROMPTS)), family


def test_sharded_gemma_matches_the_whole_model(checkpoints):
    run_on_ranks(_check_sharded_rank, 2, checkpoints)


def test_fp8_projections_and_calculated_kv_scales_stay_near_the_float_model(checkpoints):
    """Gemma 3's keys are normed (Gemma's q/k norms) and rotated (its two ropes) before the cache stores them: the
    first step's scales come from those keys, and FP8 weights with an FP8 cache keep the float model's greedy start."""
    prompt = list(range(3, 40))
    exact = _engine(checkpoints["gemma3"], WorkerConfig(model="gemma3"))
    quantized = _engine(checkpoints["gemma3"], WorkerConfig(model="gemma3", quantization="fp8", kv_cache_dtype="fp8",
                                                            calculate_kv_scales=True))
    assert quantized.model.layers[0].mlp.gate_up_proj.weight.dtype == FP8
    assert run_greedy(quantized, [prompt], 4, chunk=8)[0][:2] == run_greedy(exact, [prompt], 4, chunk=8)[0][:2]
    first_keys = exact.runner.kv_caches[0][0][0, :8]
    torch.testing.assert_close(quantized.model.layers[0].self_attn.k_scale,
                               first_keys.abs().max() * KEY_HEADROOM / FP8_MAX, rtol=0.05, atol=0)
    exact_logits, quantized_logits = prompt_logits(exact, prompt), prompt_logits(quantized, prompt)
    kl = F.kl_div(quantized_logits.log_softmax(-1), exact_logits.log_softmax(-1), log_target=True, reduction="none")
    assert kl.sum(-1).mean() < 0.05
