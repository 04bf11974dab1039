"""Prompts of every public API as the served model takes them: a chat's token ids and images (for a vision-language
model, through its processor: router/multimodal), and the check that image placeholders come only with images."""
from sluice.core.errors import InvalidArgument
from sluice.core.images import ImageInput
from sluice.router.chat import Chat
from sluice.router.config import RouterConfig
from sluice.router.multimodal.image_limits import check_encoded_images
from sluice.router.multimodal.vision_prompts import VisionPrompts


class ChatPrompts:
    def __init__(self, tokenizer, vision: VisionPrompts | None, config: RouterConfig, model_name: str):
        """vision: None for a model that takes no images."""
        self.tokenizer = tokenizer
        self.vision = vision
        self.config = config
        self.model_name = model_name

    def encode(self, chat: Chat) -> tuple[list[int], list[ImageInput]]:
        check_encoded_images(chat.images, self.config)
        if self.vision is not None:
            return self.vision.encode_chat(chat)
        if chat.images:
            raise InvalidArgument(chat.images[0].field, f"the model {self.model_name} takes no images")
        return self.tokenizer.encode_chat(chat.messages), []

    def check_placeholders(self, token_ids: list[int], images: list[ImageInput], field: str) -> None:
        if self.vision is not None:
            self.vision.check_placeholders(token_ids, images, field)
