"""The tiny Qwen2.5-VL through the real services (tests/router/tiny_vl_folder.py): prompts with 0, 1 and 2 images of
different sizes give Hugging Face's float32 greedy tokens alone and 8 at once, over a token budget that splits an
image's placeholders between prefill chunks and a KV pool small enough to preempt; a repeat of an image and its text
reports cached tokens, another image after the same text none beyond the text before it; and smg with the `openai`
client answers image_url data URIs with the native API's text."""
import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import torch

from sluice.cli.gateway import GatewayLayout, start_gateway, wait_until_gateway_serves
from sluice.cli.launcher import free_ports, stop_services
from sluice.core.images import ImageInput
from sluice.router.chat_pb import chat_from_pb
from sluice.router.multimodal.vision_prompts import VisionPrompts
from sluice.router.tokenizer import RouterTokenizer
from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import running_services
from tests.e2e.test_image_requests_through_smg import SMG_MODEL_NAME
from tests.router.images import png, user_message
from tests.router.tiny_vl_folder import MAX_PIXELS, tiny_vl_folder

pytestmark = pytest.mark.slow
MAX_NEW_TOKENS = 8
BLOCK_SIZE = 16
SCHEDULER = ["--num-blocks", "8", "--block-size", str(BLOCK_SIZE), "--max-num-batched-tokens", "24"]
WIDE, SQUARE, TALL, OTHER_WIDE = png(12, 20, seed=1), png(8, 8, seed=2), png(24, 12, seed=3), png(12, 20, seed=4)
PROMPTS = {
    "no image": [user_message("Hello there")],
    "one image": [user_message(WIDE, "What is it?")],
    "two images": [user_message("Compare", SQUARE, "with", TALL)],
    "two turns": [user_message(TALL, "Describe it."), pb.ChatMessage(role="assistant", content="Tall."),
                  user_message("And this?", WIDE)],
}

# a message's images before its text, where smg puts them
SMG_PROMPTS = [user_message(WIDE, "What is it?"), user_message(SQUARE, TALL, "Which is taller?")]


@pytest.fixture(scope="module")
def folder(default_model_dir, tmp_path_factory):
    """Named so smg (1.13) lays out Qwen's image placeholders as Qwen2.5-VL's processor does."""
    return tiny_vl_folder(default_model_dir, tmp_path_factory.mktemp(SMG_MODEL_NAME, numbered=False))


@pytest.fixture(scope="module")
def services(folder):
    with running_services(folder, scheduler_args=SCHEDULER) as running:
        yield running


@pytest.fixture(scope="module")
def prompts(folder) -> VisionPrompts:
    return VisionPrompts.of_model(folder, RouterTokenizer(folder), MAX_PIXELS)


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def _hf_greedy(hf, image_token_id: int, token_ids: list[int], images: list[ImageInput]) -> list[int]:
    input_ids = torch.tensor([token_ids])
    inputs = {"input_ids": input_ids, "mm_token_type_ids": (input_ids == image_token_id).int()}  # M-RoPE reads it
    if images:
        inputs["pixel_values"] = torch.cat([torch.from_numpy(np.frombuffer(image.pixel_values, dtype="<f4")
                                                             .reshape(image.pixel_shape)) for image in images])
        inputs["image_grid_thw"] = torch.tensor([image.grid_thw for image in images])
    with torch.inference_mode():
        output = hf.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return output[0, len(token_ids):].tolist()


def _request(messages: list[pb.ChatMessage]) -> pb.GenerateRequest:
    return pb.GenerateRequest(chat=pb.ChatMessages(messages=messages),
                              sampling=pb.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0))


@pytest.fixture(scope="module")
def expected(hf, prompts) -> dict[str, list[int]]:
    return {name: _hf_greedy(hf, prompts.image_token_id,
                             *prompts.encode_chat(chat_from_pb(pb.ChatMessages(messages=messages))))
            for name, messages in PROMPTS.items()}


@pytest.mark.parametrize("name", PROMPTS)
def test_greedy_tokens_are_hfs_alone(services, expected, name):
    assert services.client.generate(_request(PROMPTS[name])).token_ids == expected[name]


def test_greedy_tokens_are_hfs_eight_at_once_with_preemption(services, expected):
    names = [*PROMPTS, *PROMPTS]
    with ThreadPoolExecutor(len(names)) as pool:
        results = list(pool.map(lambda name: services.client.generate(_request(PROMPTS[name])), names))
    assert [result.token_ids for result in results] == [expected[name] for name in names]
    load = services.wait_until_idle()
    assert load.num_preemptions > 0 and load.num_free_blocks == load.num_total_blocks


def test_a_repeated_image_hits_the_prefix_cache_and_another_image_does_not(services, prompts):
    services.client.generate(_request([user_message(WIDE, "What is it?")]))
    repeat = services.client.generate(_request([user_message(WIDE, "What is it?")]))
    other = services.client.generate(_request([user_message(OTHER_WIDE, "What is it?")]))
    _, (image,) = prompts.encode_chat(chat_from_pb(pb.ChatMessages(messages=[user_message(WIDE, "What is it?")])))
    assert repeat.usage["cached_tokens"] >= BLOCK_SIZE * ((image.offset + image.length) // BLOCK_SIZE)
    assert other.usage["cached_tokens"] <= BLOCK_SIZE * (image.offset // BLOCK_SIZE)


def test_smg_answers_image_url_data_uris_with_the_native_apis_text(services, folder):
    layout = GatewayLayout("127.0.0.1", *free_ports(2))
    process = start_gateway(layout, [services.layout.router_address], folder)
    try:
        wait_until_gateway_serves(layout, 60, process)
        with openai.OpenAI(base_url=f"{layout.url}/v1", api_key="unused", max_retries=0) as client:
            for message in SMG_PROMPTS:
                content = [{"type": "text", "text": part.text} if part.HasField("text") else
                           {"type": "image_url", "image_url": {
                               "url": "data:image/png;base64," + base64.b64encode(part.image.data).decode()}}
                           for part in message.parts]
                answer = client.chat.completions.create(model=SMG_MODEL_NAME, max_tokens=MAX_NEW_TOKENS,
                                                        temperature=0, messages=[{"role": "user", "content": content}])
                assert answer.choices[0].message.content == services.client.generate(_request([message])).text
    finally:
        stop_services([process])
