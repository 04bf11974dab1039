"""Prompts with images submitted to a running scheduler as a router sends them (the image processor's output in
ImageInput messages on the Connect stream), and transformers' greedy tokens of the same prompts, for the tiny random
Qwen2.5-VL of tests/router/tiny_vl_folder.py (the serving tokenizer with Qwen's vision tokens)."""
import hashlib
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import torch

from sluice.v1 import generation_pb2, multimodal_pb2, scheduler_pb2, scheduler_pb2_grpc
from tests.e2e.served_greedy import MAX_NEW_TOKENS
from tests.router.tiny_vl_folder import tiny_vl_folder

TEXT = [1000 + 7 * i for i in range(20)]  # the prompts' text before their first image: one whole block and more
IMAGE_SIZES = {"wide": (12, 20), "small": (8, 8), "tall": (16, 12), "wide2": (12, 20)}  # pixels: 15, 4, 12, 15 tokens
PROMPT_IMAGES = [[], ["wide"], ["small", "tall"], ["wide2"], ["tall", "wide"], ["small"], ["wide", "small"],
                 ["wide2", "tall"]]


def tiny_checkpoint(folder: Path, tokenizer_dir: Path):
    """(the folder, transformers' model of it)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    tiny_vl_folder(tokenizer_dir, folder)
    return folder, Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()


def processed_images() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Image name -> (pixel_values, image_grid_thw [1, 3]) of a random image of its size, from transformers' image
    processor."""
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


@dataclass(frozen=True)
class VisionTokens:
    image: int
    start: int
    end: int

    @classmethod
    def of(cls, hf_config) -> "VisionTokens":
        return cls(hf_config.image_token_id, hf_config.vision_start_token_id, hf_config.vision_end_token_id)


def image_prompt(tokens: VisionTokens, text: list[int], names: list[str],
                 processed) -> tuple[list[int], list[multimodal_pb2.ImageInput]]:
    """The text, then each image between vision start and end tokens with its placeholders, three tokens after it;
    and the images as a router sends them."""
    ids, images = list(text), []
    for name in names:
        pixel_values, grid_thw = processed[name]
        length = int(grid_thw.prod()) // 4
        ids.append(tokens.start)
        images.append(multimodal_pb2.ImageInput(
            pixel_values=pixel_values.numpy().tobytes(), pixel_shape=pixel_values.shape, grid_thw=grid_thw[0].tolist(),
            offset=len(ids), length=length, hash=hashlib.sha256(pixel_values.numpy().tobytes()).digest()))
        ids += [tokens.image] * length + [tokens.end, *text[:3]]
    return ids, images


def hf_image_greedy(hf, ids: list[int], names: list[str], processed) -> list[int]:
    """transformers' greedy tokens, cut after the first EOS as the server stops there."""
    inputs = {"input_ids": torch.tensor([ids])}
    if names:
        inputs |= {"pixel_values": torch.cat([processed[name][0] for name in names]),
                   "image_grid_thw": torch.cat([processed[name][1] for name in names]),
                   "mm_token_type_ids": (inputs["input_ids"] == hf.config.image_token_id).int()}
    eos = hf.config.text_config.eos_token_id
    with torch.inference_mode():
        tokens = hf.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=None,
                             pad_token_id=eos)[0, len(ids):].tolist()
    return tokens[:tokens.index(eos) + 1] if eos in tokens else tokens


def submit(request_id: str, ids: list[int], images: list, n: int = 1) -> scheduler_pb2.Submit:
    return scheduler_pb2.Submit(request_id=request_id, prompt_token_ids=ids, images=images,
                                sampling=generation_pb2.SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, n=n))


def served(services, submits: list[scheduler_pb2.Submit]) -> dict[str, dict]:
    """Request id -> {"tokens" (of sample 0), "samples", "cached_tokens"} or {"status", "message"}: the submits sent at
    once on one Connect stream, as a router sends them, read until each of their samples finished or was refused."""
    results = {}
    for s in submits:
        samples = [[] for _ in range(s.sampling.n or 1)]
        results[s.request_id] = {"tokens": samples[0], "samples": samples}
    pending = {s.request_id: len(results[s.request_id]["samples"]) for s in submits}
    with grpc.insecure_channel(services.layout.scheduler_address) as channel:
        stream = scheduler_pb2_grpc.SchedulerStub(channel).Connect(
            iter([scheduler_pb2.RouterMessage(submit=s) for s in submits]))
        for message in stream:
            step = message.step
            ends = np.cumsum(step.token_counts).tolist()
            for request_id, index, count, end in zip(step.request_ids, step.sample_indices, step.token_counts, ends):
                results[request_id]["samples"][index] += step.token_ids[end - count:end]
            for finished in step.finished:
                results[finished.request_id]["cached_tokens"] = finished.usage.cached_tokens
                pending[finished.request_id] -= 1
            for rejection in step.rejections:
                results[rejection.request_id] = {"status": rejection.status_code, "message": rejection.message}
                pending[rejection.request_id] = 0
            if not any(pending.values()):
                stream.cancel()
                break
    return results


def assert_eight_at_once_match_hf(services, hf, processed) -> None:
    """The PROMPT_IMAGES prompts at once give transformers' greedy tokens, and leave no KV block held."""
    prompts = [image_prompt(VisionTokens.of(hf.config), TEXT, names, processed) for names in PROMPT_IMAGES]
    results = served(services, [submit(f"together-{i}", ids, images) for i, (ids, images) in enumerate(prompts)])
    assert [results[f"together-{i}"]["tokens"] for i in range(len(prompts))] == \
        [hf_image_greedy(hf, ids, names, processed) for (ids, _), names in zip(prompts, PROMPT_IMAGES)]
    assert_no_block_held(services)


def assert_no_block_held(services) -> None:
    load = services.wait_until_idle()
    assert load.num_free_blocks == load.num_total_blocks
