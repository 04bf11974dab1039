"""Phi-3 (Phi3ForCausalLM: Phi-3, Phi-3.5-mini, Phi-4-mini) at a tiny size with random weights, its q/k/v and gate/up
projections published fused: token-identical to Hugging Face greedy with LongRoPE below its switch (a max model length
within original_max_position_embeddings: the short factors) and past it (prompts longer than that: the long factors
at every position, as transformers computes a sequence that outgrew it), with Phi-4-mini's partial rotary and tied
embeddings, and with Phi-3-mini-4k's sliding window in every layer; on the torch operators and, for Phi-4-mini and
the window, the Triton kernels (under the interpreter on the CPU)."""
import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from tests.worker.stepping import run_greedy
from tests.worker.test_model_families import _TINY, _hf_model
from tests.worker.test_moe_families import lively_state

ORIGINAL_MAX = 48  # original_max_position_embeddings: LongRoPE's switch
TINY_PHI3 = {**_TINY, "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "pad_token_id": 255,
             "original_max_position_embeddings": ORIGINAL_MAX}


def _longrope(pairs: int) -> dict:
    """Short and long factors for `pairs` rotated pairs, rising as LongRoPE's do: an invented set, not a model's."""
    return {"type": "longrope", "short_factor": [1.0 + 0.25 * i for i in range(pairs)],
            "long_factor": [1.0 + 4.0 * i for i in range(pairs)]}


PHI3_FAMILIES = {
    "phi3-longrope": {"rope_scaling": _longrope(8)},  # Phi-3-mini-128k, Phi-3.5-mini: whole heads rotate
    "phi4-mini": {"rope_scaling": _longrope(6), "partial_rotary_factor": 0.75, "tie_word_embeddings": True},
}
WINDOWED = {"rope_scaling": None, "sliding_window": 7, "original_max_position_embeddings": 512}  # Phi-3-mini-4k's kind
BELOW_THE_SWITCH = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]  # with 12 new tokens, within ORIGINAL_MAX
PAST_THE_SWITCH = [list(range(60, 110)), [7] * 53]


def _expected_and_engine(family_options: dict, kernels: str):
    """Hugging Face's model, and a function building Sluice's worker of the same weights."""
    hf_config = {**TINY_PHI3, **family_options}
    state = lively_state(hf_config)
    assert "model.layers.0.self_attn.qkv_proj.weight" in state and "model.layers.0.mlp.gate_up_proj.weight" in state
    config = ModelConfig.from_hf(hf_config)
    worker_config = WorkerConfig(model="phi3", kernels=kernels)

    def engine() -> WorkerEngine:
        return WorkerEngine(worker_config, ModelLoader(worker_config).build(config, to_worker_layout(dict(state),
                                                                                                       config)))
    return _hf_model(hf_config, state), engine


def _hf_greedy(hf, prompts: list[list[int]]) -> list[list[int]]:
    return [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(p):].tolist() for p in prompts]


@pytest.mark.parametrize("family, kernels", [("phi3-longrope", "torch"), ("phi4-mini", "torch"),
                                             ("phi4-mini", "triton")])
def test_below_the_switch_matches_hf(family, kernels):
    hf, engine = _expected_and_engine(PHI3_FAMILIES[family], kernels)
    expected = _hf_greedy(hf, BELOW_THE_SWITCH)
    for batch in (BELOW_THE_SWITCH, BELOW_THE_SWITCH[2:]):  # together, and alone: one-row steps
        tokens = run_greedy(engine(), batch, 12, chunk=5, max_model_len=ORIGINAL_MAX)
        assert tokens == expected[len(BELOW_THE_SWITCH) - len(batch):]


@pytest.mark.parametrize("family", sorted(PHI3_FAMILIES))
def test_past_the_switch_matches_hf(family):
    hf, engine = _expected_and_engine(PHI3_FAMILIES[family], "torch")
    assert run_greedy(engine(), PAST_THE_SWITCH, 12, chunk=16) == _hf_greedy(hf, PAST_THE_SWITCH)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_sliding_window_matches_hf(kernels):
    hf, engine = _expected_and_engine(WINDOWED, kernels)
    windowed = engine()
    assert windowed.model_config.layer_windows == (7, 7)
    assert run_greedy(windowed, BELOW_THE_SWITCH, 12, chunk=5) == _hf_greedy(hf, BELOW_THE_SWITCH)
