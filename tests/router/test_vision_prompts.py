"""A chat with images through the router's VisionPrompts gives what transformers' Qwen2.5-VL processor gives for the
same messages: the same token ids (each image's placeholders expanded) and the same pixel values and grids, each
image placed at its placeholders and hashed by what the processor made of it."""
import io
import json

import numpy as np
import pytest
from PIL import Image

from sluice.core.errors import InvalidArgument
from sluice.router.chat_pb import chat_from_pb
from sluice.router.multimodal.vision_prompts import VisionPrompts
from sluice.router.tokenizer import RouterTokenizer
from sluice.v1 import generation_pb2 as pb
from tests.router.images import png, user_message
from tests.router.tiny_vl_folder import MAX_PIXELS

SMALL, SQUARE, LARGE = png(13, 21, seed=1), png(9, 9, seed=2), png(50, 70, seed=3)  # LARGE is scaled down
CHATS = {
    "no image": [user_message("Hello", "there")],
    "one image": [user_message(SMALL, "What is in it?")],
    "two images, two turns": [
        pb.ChatMessage(role="system", content="Be brief."), user_message("Compare", SQUARE, "with"),
        pb.ChatMessage(role="assistant", content="With what?"), user_message(LARGE, "this one.")],
}


@pytest.fixture(scope="module")
def vision(tiny_vl_dir) -> VisionPrompts:
    return VisionPrompts.of_model(tiny_vl_dir, RouterTokenizer(tiny_vl_dir), MAX_PIXELS)


@pytest.fixture(scope="module")
def hf_processor(tiny_vl_dir):
    """transformers' Qwen2_5_VLProcessor of the folder, with no video processor (it needs torchvision)."""
    from transformers import AutoTokenizer, Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    class ImagesOnly(Qwen2_5_VLProcessor):
        def check_argument_for_proper_class(self, name, argument):
            return None

    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_dir)
    return ImagesOnly(Qwen2VLImageProcessorPil.from_pretrained(tiny_vl_dir), tokenizer,
                      chat_template=tokenizer.chat_template)


def _hf_messages(messages: list[pb.ChatMessage]) -> list[dict]:
    def part(content: pb.ContentPart) -> dict:
        if content.HasField("image"):
            return {"type": "image", "image": Image.open(io.BytesIO(content.image.data))}
        return {"type": "text", "text": content.text}

    return [{"role": message.role, "content": [part(p) for p in message.parts] if message.parts
             else [{"type": "text", "text": message.content}]} for message in messages]


@pytest.mark.parametrize("name", [name for name in CHATS if name != "no image"])
def test_token_ids_and_pixels_are_the_hf_processors(vision, hf_processor, name):
    token_ids, images = vision.encode_chat(chat_from_pb(pb.ChatMessages(messages=CHATS[name])))
    expected = hf_processor.apply_chat_template(_hf_messages(CHATS[name]), add_generation_prompt=True,
                                                tokenize=True, return_dict=True)
    assert token_ids == list(expected["input_ids"][0])
    assert [image.grid_thw for image in images] == [tuple(grid) for grid in expected["image_grid_thw"].tolist()]
    pixels = np.asarray(expected["pixel_values"], dtype="<f4")
    assert b"".join(image.pixel_values for image in images) == pixels.tobytes()
    assert [image.pixel_shape[1] for image in images] == [pixels.shape[1]] * len(images)


def test_a_text_only_chat_is_the_templates_text(vision, hf_processor):
    token_ids, images = vision.encode_chat(chat_from_pb(pb.ChatMessages(messages=CHATS["no image"])))
    expected = hf_processor.apply_chat_template([{"role": "user", "content": "Hello\nthere"}],
                                                add_generation_prompt=True, tokenize=True, return_dict=True)
    assert (token_ids, images) == (list(expected["input_ids"][0]), [])


def test_each_image_sits_at_its_placeholders_between_vision_start_and_end(vision, tiny_vl_dir):
    config = json.loads((tiny_vl_dir / "config.json").read_text())
    token_ids, images = vision.encode_chat(chat_from_pb(pb.ChatMessages(messages=CHATS["two images, two turns"])))
    for image in images:
        t, h, w = image.grid_thw
        assert image.length == t * h * w // 4 and image.pixel_shape == (t * h * w, 3 * 2 * 2 * 2)
        assert token_ids[image.offset - 1] == config["vision_start_token_id"]
        assert set(token_ids[image.offset:image.offset + image.length]) == {config["image_token_id"]}
        assert token_ids[image.offset + image.length] == config["vision_end_token_id"]
    assert images[1].grid_thw[1] * images[1].grid_thw[2] * 4 <= MAX_PIXELS  # LARGE, scaled down


def test_the_hash_follows_the_processed_image(vision, tiny_vl_dir):
    def hashes(*messages):
        return [image.hash for image in vision.encode_chat(chat_from_pb(pb.ChatMessages(messages=messages)))[1]]

    assert hashes(user_message(SMALL, "a")) == hashes(user_message("b", SMALL))
    assert hashes(user_message(SMALL))[0] != hashes(user_message(SQUARE))[0]
    scaled = VisionPrompts.of_model(tiny_vl_dir, vision.tokenizer, 64)
    assert hashes(user_message(LARGE)) != [image.hash for image in scaled.encode_chat(
        chat_from_pb(pb.ChatMessages(messages=[user_message(LARGE)])))[1]]


def test_a_lower_max_pixels_scales_images_down(vision, tiny_vl_dir):
    scaled = VisionPrompts.of_model(tiny_vl_dir, vision.tokenizer, 64)
    _, images = scaled.encode_chat(chat_from_pb(pb.ChatMessages(messages=[user_message(LARGE)])))
    t, h, w = images[0].grid_thw
    assert h * w * 2 * 2 <= 64


@pytest.mark.parametrize("parts, field", [
    ((b"not an image", "hi"), "chat.messages[0].parts[0]"),
    (("hi", SMALL[:40]), "chat.messages[0].parts[1]"),
    (("a <|image_pad|> in text", SMALL), "chat"),
])
def test_bad_images_name_their_part(vision, parts, field):
    with pytest.raises(InvalidArgument) as error:
        vision.encode_chat(chat_from_pb(pb.ChatMessages(messages=[user_message(*parts)])))
    assert error.value.field == field


def test_image_placeholders_without_images_are_refused(vision):
    with pytest.raises(InvalidArgument):
        vision.check_placeholders([1, 2, vision.image_token_id], [], "tokens")
