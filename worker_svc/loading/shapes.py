"""Hugging Face configs of named model shapes, for random-weight ("dummy") benchmarks and GPU checks."""

_QWEN_ROPE = {"rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "vocab_size": 151936}
_LLAMA3_ROPE = {"rope_theta": 500_000.0, "rms_norm_eps": 1e-5, "vocab_size": 128256, "max_position_embeddings": 131072,
                "eos_token_id": [128001, 128008, 128009]}


def _llama3_scaling(factor: float) -> dict:
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}


def _alternating_windows(num_layers: int) -> list[str]:
    return ["sliding_attention" if layer % 2 == 0 else "full_attention" for layer in range(num_layers)]


PHI4_MINI_LONG_FACTOR = [  # microsoft/Phi-4-mini-instruct's config.json: rope_scaling.long_factor (short_factor: 1.0s)
    1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817, 2.187582649, 2.446418898,
    2.735880826, 3.059592084, 3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
    6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
    16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6,
    32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28, 33.49, 33.5, 44.16, 47.77]


def _gemma3_layer_types(num_layers: int) -> list[str]:
    """Five sliding-window layers to one global layer."""
    return ["full_attention" if (layer + 1) % 6 == 0 else "sliding_attention" for layer in range(num_layers)]


_GEMMA = {"head_dim": 256, "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
          "tie_word_embeddings": True}

def _qwen2_5_vl_vision(out_hidden_size: int) -> dict:
    """The vision_config of the published Qwen2.5-VL checkpoints (in_chans and spatial_patch_size: names transformers
    does not read)."""
    return {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "in_chans": 3, "out_hidden_size": out_hidden_size, "patch_size": 14, "spatial_merge_size": 2,
            "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "temporal_patch_size": 2}


_QWEN2_5_VL = {  # the published configs' top-level fields besides the language model's shape and the vision tower's
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
    "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu", "max_position_embeddings": 128000,
    "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "sliding_window": 32768, "use_sliding_window": False,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
}

SHAPES: dict[str, dict] = {
    "SmolLM2-135M": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "vocab_size": 49152, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "eos_token_id": 2,
    },
    "SmolLM2-tiny": {  # SmolLM2's vocabulary in two narrow layers: a cheap random draft model for SmolLM2
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "vocab_size": 49152, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "tie_word_embeddings": True, "eos_token_id": 2,
    },
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "max_position_embeddings": 40960, "eos_token_id": 151645, **_QWEN_ROPE,
    },
    "Qwen2.5-0.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": 32768, "eos_token_id": 151645, **_QWEN_ROPE,
    },
    "Qwen2.5-1.5B": {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 1536, "intermediate_size": 8960,
        "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "head_dim": 128,
        "max_position_embeddings": 32768, "eos_token_id": 151645, **_QWEN_ROPE,
    },
    "Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "tie_word_embeddings": True, "rope_scaling": _llama3_scaling(32.0), **_LLAMA3_ROPE,
    },
    "Llama-3.1-8B": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "tie_word_embeddings": False, "rope_scaling": _llama3_scaling(8.0), **_LLAMA3_ROPE,
    },
    "Mistral-7B-v0.3": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 32768, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "eos_token_id": 2,
    },
    "Mistral-7B-v0.1": {  # a sliding window of 4,096 tokens in every layer
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 32000, "rope_theta": 10_000.0, "rms_norm_eps": 1e-5, "sliding_window": 4096,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "eos_token_id": 2,
    },
    "Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960,
        "eos_token_id": 151645, **_QWEN_ROPE, "tie_word_embeddings": False,
    },
    "Qwen1.5-MoE-A2.7B": {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
        "intermediate_size": 5632, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
        "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
        "num_experts": 60, "num_experts_per_tok": 4, "norm_topk_prob": False, "decoder_sparse_step": 1,
        "max_position_embeddings": 8192, "eos_token_id": 151643, **_QWEN_ROPE, "tie_word_embeddings": False,
    },
    "Mixtral-8x7B": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
        "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 32768,
        "tie_word_embeddings": False, "eos_token_id": 2,
    },
    "OLMoE-1B-7B": {
        "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024,
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 128,
        "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "vocab_size": 50304,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": False,
        "eos_token_id": 50279,
    },
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880,
        "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128,
        "layer_types": _alternating_windows(24), "attention_bias": True, "swiglu_limit": 7.0, "rope_theta": 150000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "eos_token_id": 200002,
    },
    "Phi-4-mini": {  # microsoft/Phi-4-mini-instruct
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "partial_rotary_factor": 0.75, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "sliding_window": 262144, "tie_word_embeddings": True,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": PHI4_MINI_LONG_FACTOR},
        "eos_token_id": 199999,
    },
    "Phi-3-mini-4k": {  # microsoft/Phi-3-mini-4k-instruct
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rope_scaling": None, "sliding_window": 2047,
        "tie_word_embeddings": False, "eos_token_id": 32000,
    },
    "Gemma-2-2B": {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 256000,
        "max_position_embeddings": 8192, "rope_theta": 10000.0, "sliding_window": 4096,
        "layer_types": ["sliding_attention", "full_attention"] * 13, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "eos_token_id": 1, **_GEMMA,
    },
    "Gemma-3-4B": {  # the text half of google/gemma-3-4b-it (Gemma3ForConditionalGeneration's text_config)
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 2560,
        "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
        "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024,
        "layer_types": _gemma3_layer_types(34), "rope_theta": 1_000_000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "rope_local_base_freq": 10000.0,
        "attn_logit_softcapping": None, "final_logit_softcapping": None, "eos_token_id": [1, 106], **_GEMMA,
    },
    "Qwen2.5-VL-3B": {  # Qwen/Qwen2.5-VL-3B-Instruct, in the flat layout of its first config.json
        **_QWEN2_5_VL, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
        "num_attention_heads": 16, "num_key_value_heads": 2, "max_window_layers": 70, "vocab_size": 151936,
        "tie_word_embeddings": True, "vision_config": _qwen2_5_vl_vision(2048),
    },
    "Qwen2.5-VL-7B": {  # Qwen/Qwen2.5-VL-7B-Instruct
        **_QWEN2_5_VL, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "max_window_layers": 28, "vocab_size": 152064,
        "tie_word_embeddings": False, "vision_config": _qwen2_5_vl_vision(3584),
    },
}


def shape_config(name: str) -> dict:
    try:
        return dict(SHAPES[name])
    except KeyError:
        raise ValueError(f"unknown model shape {name!r}; known: {sorted(SHAPES)}") from None
