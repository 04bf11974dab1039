"""Images through a real router on loopback, in front of a scheduler that records what reaches it: a vision-language
model's chat with images arrives as the prompt and ImageInputs that the router's processor makes in process (from the
client and from `sluice generate --image`); the router's limits and bad images are INVALID_ARGUMENT naming the part,
and submit nothing; a text model refuses images, naming the part. vLLM's engine protocol takes the same images as smg
sends them preprocessed (mm_inputs), with its own bounds."""
import struct
import subprocess
import sys
import zlib

import grpc
import numpy as np
import pytest
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm
from smg_grpc_proto.generated import vllm_engine_pb2_grpc

from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient, chat_request
from sluice.core.images_pb import image_to_pb
from sluice.router.chat_pb import chat_from_pb
from sluice.router.multimodal.vision_prompts import VisionPrompts
from sluice.router.tokenizer import RouterTokenizer
from sluice.v1 import generation_pb2 as pb
from sluice.v1 import scheduler_pb2
from tests.router.images import png, user_message
from tests.router.recording_scheduler import recording_scheduler, router_over

pytestmark = pytest.mark.slow
MAX_IMAGES, MAX_PIXELS = 2, 256
SMALL, SQUARE = png(13, 21, seed=1), png(9, 9, seed=2)
MAX_BYTES = 3000
LIMITS = ["--max-images-per-request", str(MAX_IMAGES), "--max-image-pixels", str(MAX_PIXELS),
          "--max-image-bytes-per-request", str(MAX_BYTES)]


def _bomb() -> bytes:
    """A PNG's header that announces 10,000 x 10,000 pixels (more than PIL decodes), and no pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 10_000, 10_000, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b"")


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
    assert list(submit.images) == [image_to_pb(image) for image in images]
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
    assert list(scheduler.submits[request_id].images) == [image_to_pb(image) for image in images]


@pytest.mark.parametrize("request_, details", [
    (_chat(user_message(SMALL, SQUARE, SMALL)), "chat.messages[0].parts[2]: at most 2 images a request"),
    (_chat(user_message(SQUARE, "a"), user_message(png(30, 40))),
     f"chat.messages[1].parts[0]: the request's images pass {MAX_BYTES} bytes here"),
    (_chat(user_message("look", b"GIF89a not really")), "chat.messages[0].parts[1]: the image cannot be decoded"),
    (_chat(user_message(png(12, 20)[:-30])), "chat.messages[0].parts[0]: the image cannot be decoded"),
    (_chat(user_message(_bomb())), "chat.messages[0].parts[0]: the image has 10000 x 10000 pixels; at most"),
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
        with pytest.raises(grpc.RpcError) as refused:
            _engine_generate(router, [1, 2, 3], vllm.MultimodalInputs(), "")
        assert refused.value.details() == "mm_inputs: the model SmolLM2-135M-Instruct takes no images"


def _mm_inputs(submit: scheduler_pb2.Submit) -> vllm.MultimodalInputs:
    """The Submit's images as smg sends them for a Qwen-VL model: all pixel values in one tensor, image_grid_thw a
    row per image, a placeholder range per image."""
    pixels = b"".join(image.pixel_values for image in submit.images)
    rows = sum(image.pixel_shape[0] for image in submit.images)
    grids = np.array([list(image.grid_thw) for image in submit.images], dtype="<i8")
    return vllm.MultimodalInputs(
        pixel_values=vllm.TensorData(shape=[rows, submit.images[0].pixel_shape[1]], dtype="float32", inline=pixels),
        model_specific_tensors={"image_grid_thw": vllm.TensorData(shape=list(grids.shape), dtype="int64",
                                                                  inline=grids.tobytes())},
        im_token_id=49155, mm_placeholders=[vllm.PlaceholderRange(offset=image.offset, length=image.length)
                                            for image in submit.images],
        batched_keys=["image_grid_thw"], flat_keys={"pixel_values": "patches_per_image"}, modality=common_pb2.IMAGE)


def _engine_generate(router: str, token_ids: list[int], mm_inputs: vllm.MultimodalInputs, request_id: str) -> None:
    with grpc.insecure_channel(router) as channel:
        sampling = vllm.SamplingParams(max_tokens=4, top_p=1.0, repetition_penalty=1.0, n=1)  # as smg fills them
        request = vllm.GenerateRequest(request_id=request_id, tokenized=vllm.TokenizedInput(input_ids=token_ids),
                                       sampling_params=sampling, mm_inputs=mm_inputs)
        list(vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(request))


@pytest.fixture(scope="module")
def native_submit(vl) -> scheduler_pb2.Submit:
    scheduler, client, _ = vl
    result = client.generate(_chat(user_message(SMALL, "and", SQUARE), max_tokens=4))
    return scheduler.submits[result.request_id]


def test_the_engine_protocols_mm_inputs_make_the_native_apis_images(vl, native_submit):
    scheduler, _, router = vl
    with grpc.insecure_channel(router) as channel:
        engine = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        assert engine.GetModelInfo(vllm.GetModelInfoRequest()).supports_vision
        assert engine.GetServerInfo(vllm.GetServerInfoRequest()).mm_item_limits == f"image={MAX_IMAGES}"
    _engine_generate(router, list(native_submit.prompt_token_ids), _mm_inputs(native_submit), "engine-images")
    submit = scheduler.submits["engine-images"]
    assert (submit.prompt_token_ids, list(submit.images)) == (native_submit.prompt_token_ids,
                                                              list(native_submit.images))


def _edited(native_submit, edit) -> vllm.MultimodalInputs:
    mm_inputs = _mm_inputs(native_submit)
    edit(mm_inputs)
    return mm_inputs


def _grids(mm_inputs: vllm.MultimodalInputs, grids: list[list[int]]) -> None:
    mm_inputs.model_specific_tensors["image_grid_thw"].CopyFrom(vllm.TensorData(
        shape=[len(grids), 3], dtype="int64", inline=np.array(grids, dtype="<i8").tobytes()))


@pytest.mark.parametrize("edit, details", [
    (lambda m: _grids(m, [[1, 2, 2]] * 3), "mm_inputs.model_specific_tensors[image_grid_thw]: 3 images; at most 2"),
    (lambda m: _grids(m, [[1, 16, 16], [1, 4, 4]]),
     "mm_inputs.model_specific_tensors[image_grid_thw][0]: the image has 1024 pixels; at most 256"),
    (lambda m: _grids(m, [[1, 0, 4], [1, 4, 4]]), "mm_inputs.model_specific_tensors[image_grid_thw]: a row of"),
    (lambda m: m.mm_placeholders[0].MergeFrom(vllm.PlaceholderRange(length=3)), "mm_inputs.mm_placeholders[0]: "),
    (lambda m: m.mm_placeholders[1].MergeFrom(vllm.PlaceholderRange(offset=1)), "mm_inputs.mm_placeholders[1]: "),
    (lambda m: m.pixel_values.MergeFrom(vllm.TensorData(dtype="bfloat16")), "mm_inputs.pixel_values: dtype"),
    (lambda m: m.pixel_values.shm.MergeFrom(common_pb2.ShmHandle()), "mm_inputs.pixel_values: send the tensor inline"),
    (lambda m: m.MergeFrom(vllm.MultimodalInputs(modality=common_pb2.VIDEO)), "mm_inputs.modality: only images"),
])
def test_bad_mm_inputs_are_invalid_argument_naming_the_field(vl, native_submit, edit, details):
    scheduler, _, router = vl
    before = len(scheduler.submits)
    with pytest.raises(grpc.RpcError) as error:
        _engine_generate(router, list(native_submit.prompt_token_ids), _edited(native_submit, edit), "")
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(details), error.value.details()
    assert len(scheduler.submits) == before


def test_pixel_values_past_64_mib_reach_the_scheduler(tiny_vl_dir):
    """One image of 856 x 856 patches: 70 MB of pixel values, over the 64 MiB a message could carry before images,
    within what --max-image-pixels allows a request."""
    rows = columns = 856
    length = rows * columns // 4
    prompt = [5] * 8 + [49155] * length + [6] * 8
    grids = np.array([[1, rows, columns]], dtype="<i8")
    pixels = np.zeros((rows * columns, 24), dtype="<f4")
    mm_inputs = vllm.MultimodalInputs(
        pixel_values=vllm.TensorData(shape=list(pixels.shape), dtype="float32", inline=pixels.tobytes()),
        model_specific_tensors={"image_grid_thw": vllm.TensorData(shape=[1, 3], dtype="int64", inline=grids.tobytes())},
        mm_placeholders=[vllm.PlaceholderRange(offset=8, length=length)], modality=common_pb2.IMAGE)
    info = pb.ModelInfo(model="tiny-qwen2_5_vl", max_model_len=len(prompt) + 8, block_size=16, eos_token_ids=[2])
    flags = ["--max-images-per-request", "1", "--max-image-pixels", str(rows * columns * 4)]
    with recording_scheduler(info) as (scheduler, address), router_over(address, tiny_vl_dir, flags) as router:
        _engine_generate(router, prompt, mm_inputs, "large")
    (image,) = scheduler.submits["large"].images
    assert len(image.pixel_values) == pixels.nbytes > 64 * 1024 * 1024
