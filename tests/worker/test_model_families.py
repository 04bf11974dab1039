"""Every registered architecture, at a tiny size with random weights, is token-identical to Hugging Face greedy."""
import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from tests.worker.stepping import run_greedy

_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 512,
         "rms_norm_eps": 1e-6, "eos_token_id": 0}
FAMILIES = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": True},
    "llama3-rope": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0,
                    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64}},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": None},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
    "qwen2-yarn": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                   "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}},
    # windows shorter than the longer prompts: in every layer (Mistral v0.1), in the layers past max_window_layers
    "mistral-window": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 7},
    "qwen2-window": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": True,
                     "sliding_window": 6, "max_window_layers": 1},
}


def _hf_model(hf_config: dict, state: dict):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**hf_config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(name == "lm_head.weight" for name in missing)
    return model


# Triton's interpreter is slow: on the CPU it runs the families whose layers differ (biases, q/k norms, a sliding
# window); the others run their Triton kernels where a GPU compiles them.
_INTERPRETED = {"qwen2", "qwen3", "mistral-window"}


@pytest.mark.parametrize("family, kernels", [
    *((family, "torch") for family in sorted(FAMILIES)),
    *(pytest.param(family, "triton", marks=() if family in _INTERPRETED else pytest.mark.gpu)
      for family in sorted(FAMILIES))])
def test_family_matches_hf(family, kernels):
    hf_config = {**_TINY, **FAMILIES[family]}
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=1)
    state = {name: t if name.endswith("norm.weight") else t * 10 for name, t in state.items()}  # lively outputs
    hf = _hf_model(hf_config, state)
    config = ModelConfig.from_hf(hf_config)
    prompts = [[5, 17, 99, 3], [42] * 9, list(range(100, 123))]
    expected = [hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    for batch in (prompts, prompts[2:]):  # together, and alone: one-row steps take the fused linear kernels
        worker_config = WorkerConfig(model=family, kernels=kernels)
        loaded = ModelLoader(worker_config).build(config, to_worker_layout(dict(state), config))
        engine = WorkerEngine(worker_config, loaded)
        assert run_greedy(engine, batch, 12, chunk=5) == expected[len(prompts) - len(batch):]
