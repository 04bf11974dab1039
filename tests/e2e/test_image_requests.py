"""Images through a real router on loopback, in front of a scheduler that records what reaches it: a vision-language
model's chat with images arrives as the prompt and ImageInputs that the router's processor makes in process (from the
client and from `sluice generate --image`); the router's limits and bad images are INVALID_ARGUMENT naming the part,
and submit nothing; a text model refuses images, naming the part."""
import subprocess
import sys

import grpc
import pytest

from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient, chat_request
from sluice.core.image_input_pb import image_input_to_pb
from sluice.router.chat_pb import chat_from_pb
from sluice.router.multimodal.vision_prompts import VisionPrompts
from sluice.router.tokenizer import RouterTokenizer
from sluice.v1 import generation_pb2 as pb
from tests.router.images import png, user_message
from tests.router.recording_scheduler import recording_scheduler, router_over

pytestmark = pytest.mark.slow
MAX_IMAGES, MAX_PIXELS = 2, 256
SMALL, SQUARE = png(13, 21, seed=1), png(9, 9, seed=2)
MAX_BYTES = 3000
LIMITS = ["--max-images-per-request", str(MAX_IMAGES), "--max-image-pixels", str(MAX_PIXELS),
          "--max-image-bytes-per-request", str(MAX_BYTES)]


def _model_info(name: str) -> pb.ModelInfo:
    return pb.ModelInfo(model=name, max_model_len=512, vocab_size=49157, block_size=16, eos_token_ids=[2])


@pytest.fixture(scope="module")
def vl(tiny_vl_dir):
    """(recording scheduler, client, router address) of a router for the tiny Qwen2.5-VL with LIMITS."""
    with recording_scheduler(_model_info("tiny-qwen2_5_vl")) as (scheduler, address), \
            router_over(address, tiny_vl_dir, LIMITS) as router, SluiceClient(router) as client:
        yield scheduler, client, router


@pytest.fixture(scope="module")
def in_process(tiny_vl_dir) -> VisionPrompts:
    return VisionPrompts.of_model(tiny_vl_dir, RouterTokenizer(tiny_vl_dir), MAX_PIXELS)


def _chat(*messages: pb.ChatMessage, **sampling) -> pb.GenerateRequest:
    return pb.GenerateRequest(chat=pb.ChatMessages(messages=messages), sampling=pb.SamplingParams(**sampling))


def _refusal(client: SluiceClient, request: pb.GenerateRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as error:
        client.generate(request)
    return error.value


def test_a_chat_with_images_reaches_the_scheduler_as_the_processor_makes_it(vl, in_process):
    scheduler, client, _ = vl
    messages = [user_message(SMALL, "Compare it"), pb.ChatMessage(role="assistant", content="With?"),
                user_message("this:", SQUARE)]
    result = client.generate(_chat(*messages, max_tokens=4))
    token_ids, images = in_process.encode_chat(chat_from_pb(pb.ChatMessages(messages=messages)))
    submit = scheduler.submits[result.request_id]
    assert list(submit.prompt_token_ids) == token_ids and result.usage["prompt_tokens"] == len(token_ids)
    assert list(submit.images) == [image_input_to_pb(image) for image in images]
    assert [image.grid_thw for image in submit.images] == [[1, 6, 10], [1, 4, 4]]


def test_sluice_generate_sends_each_image_before_the_prompt(vl, in_process, tmp_path):
    scheduler, _, router = vl
    (tmp_path / "a.png").write_bytes(SMALL)
    (tmp_path / "b.png").write_bytes(SQUARE)
    before = set(scheduler.submits)
    subprocess.run([*sluice_command("generate"), "--address", router, "--image",
                    str(tmp_path / "a.png"), "--image", str(tmp_path / "b.png"), "--max-tokens", "4", "Compare"],
                   check=True, stdout=sys.stderr)
    (request_id,) = set(scheduler.submits) - before
    token_ids, images = in_process.encode_chat(chat_from_pb(chat_request("Compare", [SMALL, SQUARE]).chat))
    assert list(scheduler.submits[request_id].prompt_token_ids) == token_ids
    assert list(scheduler.submits[request_id].images) == [image_input_to_pb(image) for image in images]


@pytest.mark.parametrize("request_, details", [
    (_chat(user_message(SMALL, SQUARE, SMALL)), "chat.messages[0].parts[2]: at most 2 images a request"),
    (_chat(user_message(SQUARE, "a"), user_message(png(30, 40))),
     f"chat.messages[1].parts[0]: the request's images pass {MAX_BYTES} bytes here"),
    (_chat(user_message("look", b"GIF89a not really")), "chat.messages[0].parts[1]: the image cannot be decoded"),
    (_chat(user_message("a <|image_pad|>", SMALL)), "chat: the chat template placed 2 images for 1"),
    (_chat(pb.ChatMessage(role="user", content="hi", parts=[pb.ContentPart(text="hi")])),
     "chat.messages[0]: set content or parts, not both"),
    (_chat(user_message(SMALL, "a"), truncate_prompt_tokens=4),
     "sampling.truncate_prompt_tokens: a prompt with images cannot be cut"),
    (pb.GenerateRequest(tokens=pb.TokenIds(ids=[5, 49155, 6])), "tokens: the image token 49155 stands only"),
    (pb.GenerateRequest(text="an <|image_pad|>"), "text: the image token 49155 stands only"),
])
def test_bad_images_and_limits_are_invalid_argument_naming_the_part(vl, request_, details):
    scheduler, client, _ = vl
    before = len(scheduler.submits)
    error = _refusal(client, request_)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith(details), error.details()
    assert len(scheduler.submits) == before


def test_images_are_scaled_down_to_the_pixel_limit(vl):
    scheduler, client, _ = vl
    result = client.generate(_chat(user_message(png(25, 30, seed=4), "big")))
    _, h, w = scheduler.submits[result.request_id].images[0].grid_thw
    assert h * w * 2 * 2 <= MAX_PIXELS


def test_tokenize_expands_each_images_placeholders(vl, in_process):
    _, client, _ = vl
    chat = pb.ChatMessages(messages=[user_message(SMALL, "what?")])
    token_ids = client.stub.Tokenize(pb.TokenizeRequest(chat=chat)).token_ids
    assert list(token_ids) == in_process.encode_chat(chat_from_pb(chat))[0]


def test_a_text_model_refuses_an_image_naming_the_part(default_model_dir):
    with recording_scheduler(_model_info("SmolLM2-135M-Instruct")) as (scheduler, address), \
            router_over(address, default_model_dir) as router, SluiceClient(router) as client:
        error = _refusal(client, _chat(user_message("Describe", SMALL)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details() == "chat.messages[0].parts[1]: the model SmolLM2-135M-Instruct takes no images"
        result = client.generate(_chat(user_message("Say", "hi")))
        expected = RouterTokenizer(default_model_dir).encode_chat([{"role": "user", "content": "Say\nhi"}])
        assert list(scheduler.submits[result.request_id].prompt_token_ids) == expected
