"""A chat with images as a Qwen vision-language model reads it, as transformers' Qwen2.5-VL processor makes it: the
chat template places one <|image_pad|> an image, each becomes the image's placeholder tokens (t * h * w /
merge_size ** 2 of its grid of patches), and each image an ImageInput at them."""
import itertools
import json
import math
from pathlib import Path

from sluice.core.errors import InvalidArgument
from sluice.core.images import ImageInput
from sluice.router.chat import Chat
from sluice.router.multimodal.image_processor import ImageProcessor, ProcessedImage
from sluice.router.multimodal.placed_images import placed_image

IMAGE_TOKEN = "<|image_pad|>"


class VisionPrompts:
    def __init__(self, tokenizer, processor: ImageProcessor, image_token_id: int, chat_template: str | None = None):
        """chat_template: the processor's (chat_template.json), else the tokenizer's is used."""
        if tokenizer.token_id(IMAGE_TOKEN) != image_token_id:
            raise ValueError(f"the tokenizer's {IMAGE_TOKEN} is not the model's image token {image_token_id}")
        self.tokenizer = tokenizer
        self.processor = processor
        self.image_token_id = image_token_id
        self.chat_template = chat_template

    @classmethod
    def of_model(cls, model_path: Path | None, tokenizer, max_pixels: int) -> "VisionPrompts | None":
        """None for a model that takes no images."""
        if not model_takes_images(model_path):
            return None
        config = _model_config(model_path)
        template_path = model_path / "chat_template.json"
        template = json.loads(template_path.read_text())["chat_template"] if template_path.exists() else None
        return cls(tokenizer, ImageProcessor(model_path, max_pixels), config["image_token_id"], template)

    def encode_chat(self, chat: Chat) -> tuple[list[int], list[ImageInput]]:
        text = self.tokenizer.render_chat(chat.messages, self.chat_template)
        pieces = text.split(IMAGE_TOKEN)
        if len(pieces) - 1 != len(chat.images):
            raise InvalidArgument("chat", f"the chat template placed {len(pieces) - 1} images for {len(chat.images)}: "
                                          f"a text may not hold {IMAGE_TOKEN}")
        processed = [self.processor.process(image) for image in chat.images]
        lengths = [math.prod(image.grid_thw) // self.processor.merge_size ** 2 for image in processed]
        expanded = pieces[0] + "".join(IMAGE_TOKEN * length + piece for length, piece in zip(lengths, pieces[1:]))
        token_ids = self.tokenizer.encode_rendered(expanded)
        placeholders = [index for index, token_id in enumerate(token_ids) if token_id == self.image_token_id]
        offsets = [placeholders[start] for start in itertools.accumulate([0, *lengths[:-1]])] if lengths else []
        return token_ids, [_placed(image, offset, length) for image, offset, length in zip(processed, offsets, lengths)]

    def check_placeholders(self, token_ids: list[int], images: list[ImageInput], field: str) -> None:
        """Image placeholder tokens only where an image is placed: the model reads each as part of one."""
        placed = sum(image.length for image in images)
        if token_ids.count(self.image_token_id) != placed:
            raise InvalidArgument(field, f"the image token {self.image_token_id} stands only at an image's "
                                         f"placeholders; send images as parts of chat messages")


def model_takes_images(model_path: Path | None) -> bool:
    """A model folder whose config.json has a vision tower's (vision_config)."""
    return "vision_config" in _model_config(model_path)


def _model_config(model_path: Path | None) -> dict:
    config_path = model_path / "config.json" if model_path is not None and model_path.is_dir() else None
    return json.loads(config_path.read_text()) if config_path is not None and config_path.exists() else {}


def _placed(image: ProcessedImage, offset: int, length: int) -> ImageInput:
    pixels = image.pixel_values
    return placed_image(pixels.tobytes(), tuple(pixels.shape), image.grid_thw, offset, length)
