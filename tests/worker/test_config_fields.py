"""Every config field of the supported architectures is read, of no effect, or checked: a new field cannot be ignored
in silence. What no module computes is refused at start, naming the field, the weight or the architecture."""
import dataclasses
import re

import pytest
import torch
from transformers import AutoConfig
from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)

from sluice.worker.config import WorkerConfig
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.config_fields import (HONOURED, NO_EFFECT, REQUIRED, VISION_HONOURED, VISION_NO_EFFECT,
                                                VISION_REQUIRED)
from sluice.worker.models.registry import ARCHITECTURES
from tests.worker.test_gemma_families import gemma_config
from tests.worker.test_model_families import _TINY, FAMILIES
from tests.worker.test_phi3_family import TINY_PHI3
from tests.worker.tiny_qwen2_5_vl import TINY_QWEN2_5_VL

MODEL_TYPES = {architecture: model_type for mapping in (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                                                        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
               for model_type, architecture in mapping.items()}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_every_field_of_a_supported_architecture_is_accounted_for(architecture):
    """A vision-language config's top-level and text_config fields as a decoder's, its vision_config's as a tower's."""
    fields = AutoConfig.for_model(MODEL_TYPES[architecture]).to_dict()
    assert (set(fields) | set(fields.get("text_config", ()))) - HONOURED - NO_EFFECT - set(REQUIRED) == set()
    assert set(fields.get("vision_config", ())) - VISION_HONOURED - VISION_NO_EFFECT - set(VISION_REQUIRED) == set()


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_transformers_defaults_are_served(architecture):
    hf = AutoConfig.for_model(MODEL_TYPES[architecture]).to_dict() | {"architectures": [architecture]}
    if "vision_config" in hf:  # transformers' defaults pair a 3584-wide tower's output with an 8192-wide model
        hf["vision_config"]["out_hidden_size"] = hf["text_config"]["hidden_size"]
    ModelConfig.from_hf(hf)


@pytest.mark.parametrize("family, fields, message", [
    ("llama", {"attention_bias": True}, "attention_bias = True, which the worker does not implement; it supports "
                                        "false (biased attention projections)"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
    ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, "it supports rope_type default or llama3 "
                                                                          "or yarn"),
    ("llama", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
     "it supports rope_type default or llama3 or yarn"),
    ("llama", {"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5"),
    ("phi3", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 64}}, "it supports rope_type default or longrope"),
    ("qwen2", {"layer_types": ["full_attention", "chunked_attention"]}, "layers of types full_attention and "
                                                                         "sliding_attention"),
    ("llama", {"architectures": ["PhimoeForCausalLM"]}, "unsupported architecture 'PhimoeForCausalLM'; supported: ["),
])
def test_an_unimplemented_option_is_refused_by_name(family, fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ModelConfig.from_hf({**_TINY, **{**FAMILIES, "phi3": TINY_PHI3}[family], **fields})


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


def _tiny_vl(text: dict | None = None, vision: dict | None = None) -> dict:
    return {**TINY_QWEN2_5_VL, "text_config": {**TINY_QWEN2_5_VL["text_config"], **(text or {})},
            "vision_config": {**TINY_QWEN2_5_VL["vision_config"], **(vision or {})}}


@pytest.mark.parametrize("hf, message", [
    (_tiny_vl(vision={"hidden_act": "gelu"}), "Qwen2_5_VLForConditionalGeneration: config.json sets "
                                              "vision_config.hidden_act = 'gelu', which the worker does not implement"),
    (_tiny_vl(vision={"patch_size": [2, 4]}), "vision_config.patch_size = [2, 4]"),
    (_tiny_vl(vision={"rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}),
     "it supports rope_type axial"),
    (_tiny_vl(text={"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "mrope_section": [2, 3, 3]}}),
     "it supports rope_type default (partial_rotary_factor"),
    (_tiny_vl(text={"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 4]}}),
     "mrope_section [2, 3, 4] does not divide the 8 rotary frequencies of a head"),
    (_tiny_vl(vision={"out_hidden_size": 32}), "the vision tower's out_hidden_size 32 is not the language model's "
                                               "hidden_size 64"),
    ({**_TINY, **FAMILIES["qwen2"], "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
     "an mrope_section only where it takes multimodal positions"),
])
def test_a_vision_language_option_no_module_computes_is_refused_by_name(hf, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig.from_hf(hf)


@pytest.mark.parametrize("shape", ["Qwen2.5-VL-3B", "Qwen2.5-VL-7B"])
def test_qwen2_5_vl_reads_its_language_model_from_either_layout(shape):
    """The first published config.json (the language model's fields beside vision_config, M-RoPE as rope_scaling of
    type mrope), as transformers 5 saves it (text_config with rope_parameters), and as the Hub's hold it now (both)."""
    flat = shape_config(shape)
    saved = AutoConfig.for_model(**flat).to_dict() | {"architectures": flat["architectures"]}
    assert "hidden_size" not in saved and "mrope_section" in saved["text_config"]["rope_parameters"]
    configs = [ModelConfig.from_hf(hf) for hf in (flat, saved, flat | {"text_config": saved["text_config"]})]
    assert configs[0] == configs[1] == configs[2]
    config = configs[0]
    assert (config.head_dim, config.rope_theta, config.mrope_section, config.layer_windows) == \
        (128, 1e6, (16, 24, 24), ())
    assert config.tie_word_embeddings == (shape == "Qwen2.5-VL-3B") and config.eos_token_ids == (151645,)
    vision = config.vision
    assert (vision.depth, vision.head_dim, vision.window_units, vision.full_attention_blocks, vision.patch_dim,
            vision.out_hidden_size, vision.image_token_id) == (32, 80, 4, (7, 15, 23, 31), 1176,
                                                                 config.hidden_size, 151655)


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


def test_phi_shapes_read_as_transformers_computes_them():
    """Phi-4-mini: 96 of each head's 128 dims rotate, LongRoPE past its 4096 pretraining positions with the attention
    factor of 131072 / 4096, no window (262144 outlasts the context); Phi-3-mini-4k: its window in every layer."""
    phi4_mini = ModelConfig.from_hf(shape_config("Phi-4-mini"))
    assert (phi4_mini.head_dim, phi4_mini.rotary_dim, phi4_mini.tie_word_embeddings) == (128, 96, True)
    assert phi4_mini.rope_scaling["rope_type"] == "longrope" and phi4_mini.layer_windows == ()
    assert phi4_mini.rope_scaling["original_max_position_embeddings"] == 4096 and phi4_mini.rope_scaling["factor"] == 32
    phi3_mini = ModelConfig.from_hf(shape_config("Phi-3-mini-4k"))
    assert phi3_mini.rotary_dim == 96 and phi3_mini.rope_scaling is None and phi3_mini.layer_windows == (2047,) * 32
    saved = ModelConfig.from_hf(AutoConfig.for_model(**shape_config("Phi-4-mini")).to_dict()
                                | {"architectures": ["Phi3ForCausalLM"]})  # as transformers writes it
    assert dataclasses.replace(saved, rope_scaling=None) == dataclasses.replace(phi4_mini, rope_scaling=None)
    assert all(saved.rope_scaling[key] == phi4_mini.rope_scaling[key]
               for key in ("rope_type", "short_factor", "long_factor", "original_max_position_embeddings", "factor"))
    su = {**shape_config("Phi-4-mini"), "rope_scaling": {**shape_config("Phi-4-mini")["rope_scaling"], "type": "su"}}
    assert ModelConfig.from_hf(su).rope_scaling["rope_type"] == "longrope"  # the first Phi-3 configs' name


def test_an_unexpected_or_missing_weight_is_named():
    hf_config = {**_TINY, **FAMILIES["llama"]}
    config = ModelConfig.from_hf(hf_config)
    state = to_worker_layout(random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=0), config)
    loader = ModelLoader(WorkerConfig(model="tiny"))
    with pytest.raises(ValueError, match=r"weights the worker does not expect: layers.0.self_attn.sinks; weights "
                                         r"missing: layers.1.mlp.down_proj.weight \(supported architectures: \["):
        loader.build(config, {**{k: v for k, v in state.items() if k != "layers.1.mlp.down_proj.weight"},
                              "layers.0.self_attn.sinks": torch.zeros(4)})
