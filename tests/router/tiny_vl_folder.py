"""A model folder of the tiny Qwen2.5-VL (tests/worker/tiny_qwen2_5_vl.py) that a router and smg can serve: the
serving tokenizer with Qwen's vision tokens added, Qwen2.5-VL's chat template, an image processor config of its
patch sizes, and random weights over the tokenizer's vocabulary."""
import json
from pathlib import Path

from sluice.cli.dummy_folder import QWEN2_5_VL_CHAT_TEMPLATE
from tests.worker.tiny_qwen2_5_vl import hf_model

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
MIN_PIXELS, MAX_PIXELS = 4 * 4, 32 * 32  # 1 to 64 merged tokens an image
PREPROCESSOR_CONFIG = {
    "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
    "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS, "patch_size": 2, "temporal_patch_size": 2, "merge_size": 2,
}


def tiny_vl_folder(tokenizer_dir: Path, folder: Path) -> Path:
    """tokenizer_dir: the serving tokenizer's folder (SmolLM2's)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    tokenizer.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_5_VL_CHAT_TEMPLATE}))
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG))
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(VISION_TOKENS)))
    model = hf_model(vocab_size=len(tokenizer))
    for name, token in (("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>"),
                        ("vision", "<|vision_pad|>"), ("image", "<|image_pad|>"), ("video", "<|video_pad|>")):
        setattr(model.config, f"{name}_token_id", ids[token])
    model.config.text_config.bos_token_id = tokenizer.bos_token_id
    model.config.text_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    return folder
