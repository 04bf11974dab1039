"""Every config field of the supported architectures is read, of no effect, or checked: a new field cannot be ignored
in silence. What no module computes is refused at start, naming the field, the weight or the architecture."""
import re

import pytest
import torch
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from sluice.worker.config import WorkerConfig
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.config_fields import HONOURED, NO_EFFECT, REQUIRED
from sluice.worker.models.registry import ARCHITECTURES
from tests.worker.test_gemma_families import gemma_config
from tests.worker.test_model_families import _TINY, FAMILIES

MODEL_TYPES = {architecture: model_type for model_type, architecture in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_every_field_of_a_supported_architecture_is_accounted_for(architecture):
    fields = set(AutoConfig.for_model(MODEL_TYPES[architecture]).to_dict())
    assert fields - HONOURED - NO_EFFECT - set(REQUIRED) == set()


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_transformers_defaults_are_served(architecture):
    ModelConfig.from_hf(AutoConfig.for_model(MODEL_TYPES[architecture]).to_dict() | {"architectures": [architecture]})


@pytest.mark.parametrize("family, fields, message", [
    ("llama", {"attention_bias": True}, "attention_bias = True, which the worker does not implement; it supports "
                                        "false (biased attention projections)"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
    ("llama", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "it supports rope_type default or linear or "
                                                                      "llama3"),
    ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]}, "layers of types full_attention and "
                                                                         "sliding_attention"),
    ("llama", {"architectures": ["Phi3ForCausalLM"]}, "unsupported architecture 'Phi3ForCausalLM'; supported: ["),
])
def test_an_unimplemented_option_is_refused_by_name(family, fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ModelConfig.from_hf({**_TINY, **FAMILIES[family], **fields})


@pytest.mark.parametrize("family, fields, message", [
    ("gemma2", {"hidden_activation": "gelu"}, "Gemma2ForCausalLM: config.json sets hidden_activation = 'gelu'"),
    ("gemma3", {"hidden_act": "silu"}, "hidden_act = 'silu', which the worker does not implement; it supports the "
                                       "family's activation"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping = 50.0, which the worker does not implement; "
                                                 "it supports null where transformers' attention ignores it"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention = True"),
    ("gemma3", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0},
                                    "sliding_attention": {"rope_type": "default"}}}, "rope_parameters = "),
])
def test_a_gemma_option_no_module_computes_is_refused_by_name(family, fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig.from_hf({**gemma_config(family), **fields})


def test_gemma_3_reads_its_ropes_from_either_transformers_layout():
    """config.json as the Hub's Gemma 3 checkpoints hold it (transformers 4's rope_theta, rope_scaling and
    rope_local_base_freq), as transformers 5 saves it (rope_parameters per layer type), and with the fields it lacks
    taken from transformers' Gemma 3 defaults."""
    hub = gemma_config("gemma3")
    saved = AutoConfig.for_model(**hub).to_dict() | {"architectures": hub["architectures"]}
    lacking = {name: value for name, value in hub.items()
               if name not in ("rope_local_base_freq", "query_pre_attn_scalar", "tie_word_embeddings")}
    assert "rope_parameters" in saved and "rope_local_base_freq" not in saved
    configs = [ModelConfig.from_hf(hf) for hf in (hub, saved, lacking)]
    assert configs[0] == configs[1]
    assert [(c.rope_theta, c.rope_scaling["factor"], c.sliding_rope.theta, c.sliding_rope.layers)
            for c in configs] == [(1e6, 8.0, 100.0, (0, 2))] * 2 + [(1e6, 8.0, 10000.0, (0, 2))]
    assert configs[2].attention_scale == 256**-0.5 and configs[2].tie_word_embeddings


def test_gemma_2_defaults_cap_attention_and_logits():
    hub = {name: value for name, value in gemma_config("gemma2").items()
           if name not in ("attn_logit_softcapping", "final_logit_softcapping")}
    config = ModelConfig.from_hf(hub)
    assert (config.attention_softcap, config.final_logit_softcap, config.sliding_rope) == (50.0, 30.0, None)


def test_olmoe_clip_qkv_is_refused():
    with pytest.raises(ValueError, match=r"OlmoeForCausalLM: config.json sets clip_qkv = 8.0"):
        ModelConfig.from_hf(AutoConfig.for_model("olmoe", clip_qkv=8.0).to_dict() | {"architectures":
                                                                                        ["OlmoeForCausalLM"]})


@pytest.mark.parametrize("family, windows", [
    ("mistral-window", (7, 7)), ("qwen2-window", (0, 6)), ("mistral", ()), ("qwen2", ())])
def test_layer_windows_follow_transformers(family, windows):
    hf_config = {**_TINY, **FAMILIES[family]}
    assert ModelConfig.from_hf(hf_config).layer_windows == windows
    saved = AutoConfig.for_model(**hf_config).to_dict()  # with the layer_types transformers writes
    assert ModelConfig.from_hf(saved).layer_windows == windows


def test_an_unexpected_or_missing_weight_is_named():
    hf_config = {**_TINY, **FAMILIES["llama"]}
    config = ModelConfig.from_hf(hf_config)
    state = to_worker_layout(random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=0), config)
    loader = ModelLoader(WorkerConfig(model="tiny"))
    with pytest.raises(ValueError, match=r"weights the worker does not expect: layers.0.self_attn.sinks; weights "
                                         r"missing: layers.1.mlp.down_proj.weight \(supported architectures: \["):
        loader.build(config, {**{k: v for k, v in state.items() if k != "layers.1.mlp.down_proj.weight"},
                              "layers.0.self_attn.sinks": torch.zeros(4)})
