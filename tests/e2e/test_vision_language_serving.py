"""A tiny random Qwen2.5-VL served through the real scheduler and worker, its images made by transformers' image
processor and submitted on the scheduler's Connect stream as a router sends them: greedy tokens identical to
transformers' for prompts of 0, 1 and 2 images of different sizes, alone and 8 at once over a KV pool too small for
them (preemption), with a token budget that splits images' placeholders across steps and an encoder budget that
sends an image to a later step; a repeat of an image and its text hits the prefix cache, another image after the same
text hits it only before the image; a bad image is refused naming it; no KV block is left held."""
import hashlib

import grpc
import numpy as np
import pytest
import torch

from sluice.v1 import generation_pb2, multimodal_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.e2e.served_greedy import MAX_NEW_TOKENS, copy_tokenizer
from tests.e2e.services import running_services
from tests.worker.tiny_qwen2_5_vl import IMAGE_TOKEN, VISION_END, VISION_START, hf_model

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
SCHEDULER_ARGS = ["--num-blocks", "10", "--block-size", str(BLOCK_SIZE), "--max-num-batched-tokens", "32",
                  "--max-num-encoder-input-tokens", "15", "--encoder-cache-size", "32"]
EOS_TOKEN_ID = 0  # TINY_QWEN2_5_VL's
TEXT = [1000 + 7 * i for i in range(20)]  # the prompts' text before their first image: one whole block and more
IMAGE_SIZES = {"wide": (12, 20), "small": (8, 8), "tall": (16, 12), "wide2": (12, 20)}  # pixels: 15, 4, 12, 15 tokens
PROMPT_IMAGES = [[], ["wide"], ["small", "tall"], ["wide2"], ["tall", "wide"], ["small"], ["wide", "small"],
                 ["wide2", "tall"]]


@pytest.fixture(scope="module")
def model(tmp_path_factory, default_model_dir, hf_tokenizer):
    """(the checkpoint folder, transformers' model of it)."""
    folder = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    hf = hf_model(vocab_size=len(hf_tokenizer))
    hf.save_pretrained(folder)
    return copy_tokenizer(default_model_dir, folder), hf


@pytest.fixture(scope="module")
def services(model):
    with running_services(model[0], SCHEDULER_ARGS) as running:
        yield running


@pytest.fixture(scope="module")
def processed() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Image name -> (pixel_values, image_grid_thw [1, 3]) from transformers' image processor."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(patch_size=2, temporal_patch_size=2, merge_size=2,
                                         size={"shortest_edge": 16, "longest_edge": 4096})
    images = {}
    for seed, (name, (height, width)) in enumerate(IMAGE_SIZES.items()):
        pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
        output = processor(images=[Image.fromarray(pixels)], return_tensors="pt")
        images[name] = output["pixel_values"], output["image_grid_thw"]
    return images


def _prompt(text: list[int], names: list[str], processed) -> tuple[list[int], list[multimodal_pb2.ImageInput]]:
    """The text, then each image between vision start and end tokens with its placeholders, three tokens after it;
    and the images as a router sends them."""
    ids, images = list(text), []
    for name in names:
        pixel_values, grid_thw = processed[name]
        length = int(grid_thw.prod()) // 4
        ids.append(VISION_START)
        images.append(multimodal_pb2.ImageInput(
            pixel_values=pixel_values.numpy().tobytes(), pixel_shape=pixel_values.shape, grid_thw=grid_thw[0].tolist(),
            offset=len(ids), length=length, hash=hashlib.sha256(pixel_values.numpy().tobytes()).digest()))
        ids += [IMAGE_TOKEN] * length + [VISION_END, *text[:3]]
    return ids, images


def _hf_greedy(hf, ids: list[int], names: list[str], processed) -> list[int]:
    inputs = {"input_ids": torch.tensor([ids])}
    if names:
        inputs |= {"pixel_values": torch.cat([processed[name][0] for name in names]),
                   "image_grid_thw": torch.cat([processed[name][1] for name in names]),
                   "mm_token_type_ids": (inputs["input_ids"] == IMAGE_TOKEN).int()}
    with torch.inference_mode():
        tokens = hf.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=EOS_TOKEN_ID)[0, len(ids):].tolist()
    return tokens[:tokens.index(EOS_TOKEN_ID) + 1] if EOS_TOKEN_ID in tokens else tokens


def _submit(request_id: str, ids: list[int], images: list) -> scheduler_pb2.Submit:
    return scheduler_pb2.Submit(request_id=request_id, prompt_token_ids=ids, images=images,
                                sampling=generation_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0))


def _served(services, submits: list[scheduler_pb2.Submit]) -> dict[str, dict]:
    """Request id -> {"tokens", "cached_tokens"} or {"status", "message"}: the submits sent at once on one Connect
    stream, as a router sends them, read until each finished or was refused."""
    results = {submit.request_id: {"tokens": []} for submit in submits}
    pending = set(results)
    with grpc.insecure_channel(services.layout.scheduler_address) as channel:
        stream = scheduler_pb2_grpc.SchedulerStub(channel).Connect(
            iter([scheduler_pb2.RouterMessage(submit=submit) for submit in submits]))
        for message in stream:
            step = message.step
            ends = np.cumsum(step.token_counts).tolist()
            for request_id, count, end in zip(step.request_ids, step.token_counts, ends):
                results[request_id]["tokens"] += step.token_ids[end - count:end]
            for finished in step.finished:
                results[finished.request_id]["cached_tokens"] = finished.usage.cached_tokens
                pending.discard(finished.request_id)
            for rejection in step.rejections:
                results[rejection.request_id] = {"status": rejection.status_code, "message": rejection.message}
                pending.discard(rejection.request_id)
            if not pending:
                stream.cancel()
                break
    return results


def _assert_no_block_held(services) -> None:
    load = services.wait_until_idle()
    assert load.num_free_blocks == load.num_total_blocks


def test_prompts_of_0_1_and_2_images_alone_match_hf(services, model, processed):
    for index, names in enumerate(PROMPT_IMAGES):
        ids, images = _prompt(TEXT, names, processed)
        result = _served(services, [_submit(f"alone-{index}", ids, images)])[f"alone-{index}"]
        assert result["tokens"] == _hf_greedy(model[1], ids, names, processed), names
    _assert_no_block_held(services)


def test_eight_at_once_over_a_small_pool_match_hf(services, model, processed):
    """Eight prompts of ~3 blocks each over a pool of 10 (preemption), 16 tokens a step (images split across steps)
    and 16 image tokens encoded a step (a wide image and a small one never encode in one step)."""
    prompts = [_prompt(TEXT, names, processed) for names in PROMPT_IMAGES]
    preemptions = services.load().num_preemptions
    results = _served(services, [_submit(f"together-{i}", ids, images) for i, (ids, images) in enumerate(prompts)])
    assert [results[f"together-{i}"]["tokens"] for i in range(len(prompts))] == \
        [_hf_greedy(model[1], ids, names, processed) for (ids, _), names in zip(prompts, PROMPT_IMAGES)]
    assert services.load().num_preemptions > preemptions
    _assert_no_block_held(services)


def test_prefix_cache_holds_an_image_and_its_text_but_not_another_image(services, model, processed):
    text = [2000 + 3 * i for i in range(20)]  # text no earlier prompt has
    ids, images = _prompt(text, ["wide"], processed)
    first = _served(services, [_submit("first", ids, images)])["first"]
    repeat = _served(services, [_submit("repeat", ids, images)])["repeat"]
    other_ids, other_images = _prompt(text, ["wide2"], processed)  # the same placeholder tokens, another image
    other = _served(services, [_submit("other", other_ids, other_images)])["other"]
    assert first["tokens"] == repeat["tokens"] == _hf_greedy(model[1], ids, ["wide"], processed)
    assert other["tokens"] == _hf_greedy(model[1], other_ids, ["wide2"], processed)
    assert first["cached_tokens"] == 0
    assert repeat["cached_tokens"] >= images[0].offset + images[0].length - BLOCK_SIZE  # through the image's blocks
    assert other["cached_tokens"] == images[0].offset // BLOCK_SIZE * BLOCK_SIZE  # the text's whole blocks
    _assert_no_block_held(services)


def test_an_image_whose_pixels_do_not_match_its_grid_is_refused_naming_it(services, processed):
    ids, images = _prompt(TEXT, ["small", "tall"], processed)
    images[1].pixel_shape[:] = [images[1].pixel_shape[0] - 1, images[1].pixel_shape[1]]
    result = _served(services, [_submit("bad", ids, images)])["bad"]
    assert result["status"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert result["message"].startswith("images[1]: pixel_shape")
    _assert_no_block_held(services)

