"""gpt-oss under `--quantization fp8`: the attention projections and the experts in e4m3 with a scale per row, as the
other families are quantized, their biases in the model dtype; the router, the sinks, the embedding and the LM head
as they are. The tiny gpt-oss in FP8 stays near the float model on the torch operators and on the Triton kernels (the
interpreter), which compute the same FP8 model; SmolLM2's real weights made a gpt-oss (upcycled_moe.py) stay as near
in FP8 as SmolLM2's do."""
import pytest
import torch
import torch.nn.functional as F

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.fp8 import FP8, Fp8Linear, quantize_rows
from tests.worker.stepping import prompt_logits
from tests.worker.test_fp8_accuracy import SCORED_PASSAGE
from tests.worker.test_gpt_oss import TINY_GPT_OSS, gpt_oss_state
from tests.worker.upcycled_moe import write_upcycled_gpt_oss

# gpt_oss_state's scale for the accuracy checks: at its lively 10 the random model amplifies any rounding (the FP8
# attention weights alone, dequantized, move its logits by a mean KL of 0.21)
CALM_SCALE = 4
PROMPT = torch.randint(1, 255, (64,), generator=torch.Generator().manual_seed(0)).tolist()


def _tiny_engine(scale: float = CALM_SCALE, **options) -> WorkerEngine:
    config = ModelConfig.from_hf(TINY_GPT_OSS)
    worker_config = WorkerConfig(model="gpt-oss", **options)
    state = to_worker_layout(gpt_oss_state(scale=scale), config)
    return WorkerEngine(worker_config, ModelLoader(worker_config).build(config, state))


def _kl(logits: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Each position's KL divergence from exact's distribution to logits'."""
    return F.kl_div(torch.log_softmax(logits, -1), torch.log_softmax(exact, -1), log_target=True,
                    reduction="none").sum(-1)


def _assert_quantized_rows(values: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor) -> None:
    """values and scales: weights [..., columns] quantized row by row."""
    expected_values, expected_scales = quantize_rows(weights.flatten(0, -2))
    assert torch.equal(values.view(torch.uint8), expected_values.view(weights.shape).view(torch.uint8))
    assert torch.equal(scales, expected_scales.view(weights.shape[:-1]))


def test_quantization_fp8_quantizes_attention_and_experts_per_row():
    float_model, model = _tiny_engine(scale=10).model, _tiny_engine(scale=10, quantization="fp8").model
    for float_layer, layer in zip(float_model.layers, model.layers):
        for name in ("qkv_proj", "o_proj"):
            float_projection, projection = getattr(float_layer.self_attn, name), getattr(layer.self_attn, name)
            assert isinstance(projection, Fp8Linear) and torch.equal(projection.bias, float_projection.bias)
            _assert_quantized_rows(projection.weight, projection.weight_scale, float_projection.weight)
        float_experts, experts = float_layer.mlp.experts, layer.mlp.experts
        for name in ("w13", "w2"):
            _assert_quantized_rows(getattr(experts, name), getattr(experts, f"{name}_scale"),
                                   getattr(float_experts, name))
            assert torch.equal(getattr(experts, f"{name}_bias"), getattr(float_experts, f"{name}_bias"))
        assert torch.equal(layer.mlp.router.weight, float_layer.mlp.router.weight)
        assert torch.equal(layer.self_attn.sinks, float_layer.self_attn.sinks)
    for name in ("embed_tokens", "lm_head"):
        assert torch.equal(getattr(model, name).weight, getattr(float_model, name).weight)


def test_tiny_fp8_model_stays_near_the_float_model_on_both_operators():
    """The float model on the torch operators (the Triton kernels' float logits are the same within 1e-5). Measured:
    mean KL 0.035 on both; the two FP8 models' logits within 5e-3 of each other, FP8's own effect on them up to
    2.3."""
    exact = prompt_logits(_tiny_engine(), PROMPT)
    torch_fp8, triton_fp8 = (prompt_logits(_tiny_engine(quantization="fp8", kernels=kernels), PROMPT)
                             for kernels in ("torch", "triton"))
    for logits in (torch_fp8, triton_fp8):
        assert _kl(logits, exact).mean() < 0.06
    torch.testing.assert_close(triton_fp8, torch_fp8, atol=0.03, rtol=0)


@pytest.fixture(scope="module")
def upcycled(default_model_dir, tmp_path_factory):
    return write_upcycled_gpt_oss(default_model_dir, tmp_path_factory.mktemp("upcycled") / "gpt-oss", 4)


def test_fp8_of_real_weights_stays_close_to_the_float_model(default_model_dir, upcycled, hf_tokenizer):
    """SmolLM2 as a gpt-oss of 4 experts (its float logits are SmolLM2's, within 1e-4), quantized at load, on the
    scored passage. Measured: mean KL to SmolLM2 0.024, the same argmax at 92% of positions (SmolLM2 in FP8,
    test_fp8_accuracy: 0.029, 91%)."""
    ids = hf_tokenizer(SCORED_PASSAGE.read_text()).input_ids
    exact = prompt_logits(WorkerEngine.load(WorkerConfig(model=str(default_model_dir))), ids)
    engine = WorkerEngine.load(WorkerConfig(model=str(upcycled), quantization="fp8"))
    assert engine.model.layers[0].mlp.experts.w13.dtype == FP8
    logits = prompt_logits(engine, ids)
    assert _kl(logits, exact).mean() < 0.05
    assert (logits.argmax(-1) == exact.argmax(-1)).float().mean() >= 0.85
