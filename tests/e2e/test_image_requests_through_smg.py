"""Images through a real smg with the `openai` client (image_url data URIs), in front of a real router and a
scheduler that records what reaches it: smg preprocesses the image itself (from the model folder's
preprocessor_config.json and chat template) and sends vLLM's mm_inputs; the router turns them into the Submit that
the native API makes of the same image and text. smg's pixel values are its own (its resize and normalisation are
Rust's, not PIL's): they round differently, so their hash differs from the native API's for the same image."""
import base64

import numpy as np
import openai
import pytest

from sluice.cli.gateway import GatewayLayout, start_gateway, wait_until_gateway_serves
from sluice.cli.launcher import free_ports, stop_services
from sluice.v1 import generation_pb2 as pb
from tests.router.images import png, user_message
from tests.router.recording_scheduler import recording_scheduler, router_over

pytestmark = pytest.mark.slow
# smg (1.13) picks its image processor and prompt layout by the model's name. Under a Qwen3-VL name it expands each
# <|image_pad|> that Qwen's chat template places, as Qwen2.5-VL's processor does; under a Qwen2.5-VL name it wants an
# "<image>" token that no Qwen2.5-VL tokenizer has, and answers 400 before the router sees the request.
SMG_MODEL_NAME = "tiny-qwen3-vl"
SMG_QWEN2_5_VL_NAME_FAILS = pytest.mark.xfail(strict=True, raises=openai.BadRequestError,
                                              reason="smg (1.13)'s Qwen2/2.5-VL layout wants an <image> token")
IMAGES = {  # the images, and how close smg's pixel values come to the native API's
    "one image of whole merged patches": ([png(12, 20, seed=1)], 1e-5),
    "two images": ([png(12, 20, seed=1), png(8, 8, seed=2)], 1e-5),
    "one image to resize": ([png(13, 21, seed=3)], 0.05),
}
QUESTION = "What is in it?"


def _model_info(name: str) -> pb.ModelInfo:
    return pb.ModelInfo(model=name, architecture="Qwen2_5_VLForConditionalGeneration", max_model_len=512,
                        vocab_size=49157, block_size=16, eos_token_ids=[2])


@pytest.fixture(scope="module", params=[SMG_MODEL_NAME, pytest.param("tiny-qwen2.5-vl",
                                                                       marks=SMG_QWEN2_5_VL_NAME_FAILS)])
def stack(request, tiny_vl_dir):
    """(recording scheduler, native client, openai client, model name) of smg over a router over the scheduler."""
    from sluice.client import SluiceClient

    with recording_scheduler(_model_info(request.param)) as (scheduler, address), \
            router_over(address, tiny_vl_dir) as router, SluiceClient(router) as native:
        layout = GatewayLayout("127.0.0.1", *free_ports(2))
        process = start_gateway(layout, [router], tiny_vl_dir)
        try:
            wait_until_gateway_serves(layout, 60, process)
            with openai.OpenAI(base_url=f"{layout.url}/v1", api_key="unused", max_retries=0) as client:
                yield scheduler, native, client, request.param
        finally:
            stop_services([process])


def _data_uri(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


@pytest.mark.parametrize("name", IMAGES)
def test_smgs_mm_inputs_reach_the_scheduler_as_the_native_apis_images(stack, name):
    scheduler, native, client, model = stack
    images, tolerance = IMAGES[name]
    content = [*({"type": "image_url", "image_url": {"url": _data_uri(image)}} for image in images),
               {"type": "text", "text": QUESTION}]
    through_smg = client.chat.completions.create(model=model, max_tokens=4,
                                                 messages=[{"role": "user", "content": content}])
    request = pb.GenerateRequest(chat=pb.ChatMessages(messages=[user_message(*images, QUESTION)]),
                                 sampling=pb.SamplingParams(max_tokens=4))
    expected = scheduler.submits[native.generate(request).request_id]
    (submit,) = [submit for request_id, submit in scheduler.submits.items() if request_id.startswith(through_smg.id)]
    assert submit.prompt_token_ids == expected.prompt_token_ids
    assert [_placement(image) for image in submit.images] == [_placement(image) for image in expected.images]
    for image, native_image in zip(submit.images, expected.images):
        assert np.allclose(_pixels(image), _pixels(native_image), rtol=0, atol=tolerance)


def test_smg_puts_a_messages_images_before_its_text(stack):
    scheduler, native, client, model = stack
    image = IMAGES["one image of whole merged patches"][0][0]
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": _data_uri(image)}}]
    through_smg = client.chat.completions.create(model=model, max_tokens=4,
                                                 messages=[{"role": "user", "content": content}])
    request = pb.GenerateRequest(chat=pb.ChatMessages(messages=[user_message(image, QUESTION)]),
                                 sampling=pb.SamplingParams(max_tokens=4))
    expected = scheduler.submits[native.generate(request).request_id]
    (submit,) = [submit for request_id, submit in scheduler.submits.items() if request_id.startswith(through_smg.id)]
    assert submit.prompt_token_ids == expected.prompt_token_ids


def _placement(image) -> tuple:
    return tuple(image.pixel_shape), tuple(image.grid_thw), image.offset, image.length


def _pixels(image) -> np.ndarray:
    return np.frombuffer(image.pixel_values, dtype="<f4")
