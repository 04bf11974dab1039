"""A tiny Qwen2.5-VL with the real options (window and full attention blocks, spatial merging, M-RoPE), its
transformers model with lively random weights, and images as an image processor hands them over."""
import numpy as np
import torch

IMAGE_TOKEN = 250
VISION_START, VISION_END = 252, 253
TINY_QWEN2_5_VL = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "text_config": {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                    "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 0,
                    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}},
    # windows of 2 x 2 merged tokens (8 pixels / 2 per patch / 2 patches per token), two blocks of full attention
    "vision_config": {"depth": 4, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64,
                      "patch_size": 2, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 8,
                      "fullatt_block_indexes": [1, 3]},
    "image_token_id": IMAGE_TOKEN, "video_token_id": 251, "vision_start_token_id": VISION_START,
    "vision_end_token_id": VISION_END, "tie_word_embeddings": False,
}
GRIDS = [(1, 6, 10), (1, 4, 4), (1, 8, 6)]  # frames, rows and columns of patches: ragged windows, a whole one


def hf_model(seed: int = 0, vocab_size: int = 256):
    """transformers' Qwen2_5_VLForConditionalGeneration of TINY_QWEN2_5_VL (of a larger vocabulary: a tokenizer's),
    every weight random (norms near 1)."""
    from transformers import AutoConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = {**TINY_QWEN2_5_VL, "text_config": {**TINY_QWEN2_5_VL["text_config"], "vocab_size": vocab_size}}
    model = Qwen2_5_VLForConditionalGeneration(AutoConfig.for_model(**config)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.normal_(1.0, 0.1) if "norm" in name or "ln_q" in name else parameter.normal_(0.0, 0.1)
    return model


def images(grids: list[tuple[int, int, int]], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values [num_patches, 3 * 2 * 2 * 2], image_grid_thw [num_images, 3]) of random images."""
    patch_dim = 3 * 2 * 2 * 2
    pixels = np.random.default_rng(seed).standard_normal((sum(t * h * w for t, h, w in grids), patch_dim))
    return torch.from_numpy(pixels.astype(np.float32)), torch.tensor(grids)


def prompt(grids: list[tuple[int, int, int]], text: list[int]) -> list[int]:
    """Text, then each image between vision start and end tokens with its placeholders, text between them."""
    ids = list(text)
    for t, h, w in grids:
        ids += [VISION_START, *[IMAGE_TOKEN] * (t * h * w // 4), VISION_END, *text[:3]]
    return ids
