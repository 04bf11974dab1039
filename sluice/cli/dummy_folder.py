"""What a router reads of a dummy ("random weights") shape. A text shape's router takes token ids only; a
vision-language shape's reads a folder as a local Qwen2.5-VL checkpoint has it, less the weights: the shape's
config.json, Qwen2.5-VL's image processor config (transformers' Qwen2-VL image processor at its defaults, which are
Qwen2.5-VL's) and chat template, and a tokenizer with Qwen's special tokens at Qwen's ids. Qwen's own vocabulary is not
on this machine (nothing is downloaded), so the tokenizer's 151,643 ordinary tokens are the 256 byte-level ones and
then strings of them, which no merge reaches: text encodes one token a byte."""
import itertools
import json
from pathlib import Path

QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}")
QWEN_ORDINARY_TOKENS = 151643
QWEN_SPECIAL_TOKENS = [  # from id QWEN_ORDINARY_TOKENS on
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>"]


def router_model_flags(load_format: str, model: str, cache_dir: Path) -> list[str]:
    folder = router_model(load_format, model, cache_dir)
    return ["--no-tokenizer"] if folder is None else ["--model", str(folder)]


def router_model(load_format: str, model: str, cache_dir: Path) -> Path | None:
    """The folder the router tokenizes with: the model's, a dummy vision-language shape's as above; None for a dummy
    text shape."""
    if load_format != "dummy":
        return Path(model)
    from sluice.worker.loading.shapes import shape_config

    config = shape_config(model)
    if "vision_config" not in config:
        return None
    return dummy_vision_folder(model, config, cache_dir / "dummy" / model)


def dummy_vision_folder(name: str, config: dict, folder: Path) -> Path:
    """Written once; config.json last, so a folder that has it is whole."""
    if (folder / "config.json").exists():
        return folder
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    specials = {token: QWEN_ORDINARY_TOKENS + index for index, token in enumerate(QWEN_SPECIAL_TOKENS)}
    tokenizer = Qwen2Tokenizer(vocab=_byte_level_vocabulary(QWEN_ORDINARY_TOKENS) | specials, merges=[],
                               eos_token="<|im_end|>", additional_special_tokens=QWEN_SPECIAL_TOKENS)
    tokenizer.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    if tokenizer.convert_tokens_to_ids("<|image_pad|>") != config["image_token_id"]:
        raise ValueError(f"{name}: its image token is not Qwen's <|image_pad|>")
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    Qwen2VLImageProcessorPil().save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def _byte_level_vocabulary(size: int) -> dict[str, int]:
    """The byte-level alphabet, then its strings of two characters, three, ... up to `size` tokens."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    strings = itertools.chain.from_iterable(map("".join, itertools.product(alphabet, repeat=length))
                                            for length in itertools.count(1))
    return dict(zip(itertools.islice(strings, size), range(size)))
