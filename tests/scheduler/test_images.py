"""Images in the scheduler: prefix hashes of placeholder blocks take the images' hashes; the encoder budget cuts a
chunk before an image it cannot encode this step; the encoder cache's bookkeeping (what each step encodes, with
pixels, and frees) matches a worker that holds exactly what the plans say, through chunked prefill, reuse by hash,
n > 1 samples, eviction and preemption; bad images are refused naming them."""
import random
from dataclasses import replace

import pytest

from sluice.core.errors import InvalidArgument
from sluice.core.images import ImageInput, VisionInfo
from sluice.core.sampling_params import SamplingParams
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.kv_cache.prefix_hash import extend_block_hashes
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import Scheduler
from tests.scheduler.sched_testkit import EOS, FakeWorker, run_ahead

IMAGE_TOKEN = 99_999
VISION = VisionInfo(image_token_id=IMAGE_TOKEN, spatial_merge_size=2, patch_dim=4)
BLOCK_SIZE = 16


def _image(name: str, offset: int, length: int) -> ImageInput:
    """An image of `length` placeholders at `offset`, a grid of 1 x 2 x 2 * length patches, named by its hash."""
    num_patches = 4 * length
    return ImageInput(name.encode(), offset, length, (1, 2, 2 * length), bytes(4 * num_patches * VISION.patch_dim),
                      (num_patches, VISION.patch_dim))


def _request(request_id: str, parts: list, max_tokens: int = 4, **params) -> Request:
    """parts: text (a list of token ids) and images ((name, placeholders)), in prompt order."""
    prompt, images = [], []
    for part in parts:
        if isinstance(part, tuple):
            images.append(_image(part[0], len(prompt), part[1]))
            prompt += [IMAGE_TOKEN] * part[1]
        else:
            prompt += part
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens, **params), images=tuple(images))


def _scheduler(num_blocks: int = 64, vision: VisionInfo | None = VISION, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(num_blocks=num_blocks, block_size=BLOCK_SIZE, **config), {EOS}, vision=vision)


class EncoderWorker(FakeWorker):
    """The FakeWorker, also holding encoder outputs as the plans say: each chunk's images must be held."""

    def __init__(self, scheduler: Scheduler, **kwargs):
        super().__init__(block_size=BLOCK_SIZE, **kwargs)
        self.scheduler = scheduler
        self.held: set[bytes] = set()
        self.encoded: list[bytes] = []
        self.images: dict[str, tuple[ImageInput, ...]] = {}

    def execute(self, plan):
        for image_hash in plan.freed_encoder_hashes:
            self.held.remove(image_hash)
        for image in plan.encoder_inputs:
            assert image.hash not in self.held and len(image.pixel_values) == 4 * VISION.patch_dim * 4 * image.length
            self.held.add(image.hash)
            self.encoded.append(image.hash)
        assert sum(plan.num_scheduled_tokens.values()) <= self.scheduler.config.max_num_batched_tokens
        assert sum(image.length for image in plan.encoder_inputs) <= self.scheduler.config.max_num_encoder_input_tokens
        for new in plan.new_requests:
            assert all(not image.pixel_values for image in new.images)
            self.images[new.request_id] = new.images
        starts = {r.request_id: r.num_computed_tokens for r in (*plan.new_requests, *plan.cached_requests)}
        for request_id, num_tokens in plan.num_scheduled_tokens.items():
            start = starts[request_id]
            for image in self.images.get(request_id, ()):
                if image.offset < start + num_tokens and image.end > start:
                    assert image.hash in self.held, f"{request_id} reads {image.hash} in step {plan.step_id}"
        return super().execute(plan)


def _run(scheduler: Scheduler, worker: EncoderWorker) -> dict[str, list]:
    """Steps to the end; each request's tokens and (cached tokens) in the last update."""
    results = {}
    for _ in range(10_000):
        if not scheduler.has_unfinished_requests():
            return results
        plan = scheduler.schedule()
        for update in scheduler.update_from_outcome(plan, worker.execute(plan)):
            results.setdefault(update.request_id, []).extend(update.new_token_ids)
            results[update.request_id + ":cached"] = update.num_cached_tokens
    raise AssertionError("no progress")


def test_block_hashes_take_the_hashes_of_the_images_whose_placeholders_they_hold():
    text = list(range(1, 21))
    tokens = text + [IMAGE_TOKEN] * 20 + text
    hashes = {}
    for name in ("a", "b"):
        hashes[name] = []
        extend_block_hashes(hashes[name], tokens, BLOCK_SIZE, None, [_image(name, 20, 20)])
    plain = []
    extend_block_hashes(plain, tokens, BLOCK_SIZE, None)
    assert hashes["a"][0] == hashes["b"][0] == plain[0]  # tokens 0-15: text only
    assert all(a != b for a, b in zip(hashes["a"][1:], hashes["b"][1:]))  # 16-31 holds a placeholder, and after
    assert hashes["a"][1] != plain[1]


def test_a_repeat_of_an_image_hits_through_it_and_another_image_only_before_it():
    scheduler = _scheduler()
    worker = EncoderWorker(scheduler)
    text = list(range(1, 21))
    for request_id, name in (("first", "a"), ("repeat", "a"), ("other", "b")):
        scheduler.add_request(_request(request_id, [text, (name, 20), text]))
        results = _run(scheduler, worker)
        assert results[f"{request_id}:cached"] == {"first": 0, "repeat": 48, "other": 16}[request_id]
    assert worker.encoded == [b"a", b"b"]  # the repeat read the output held since the first
    assert (scheduler.encoder_cache.num_reads, scheduler.encoder_cache.num_hits) == (2, 0)  # the repeat's hit
    # covers the image's blocks: it reads no output


def test_another_request_of_a_held_image_reads_its_output():
    scheduler = _scheduler()
    worker = EncoderWorker(scheduler)
    for request_id in ("first", "second"):
        scheduler.add_request(_request(request_id, [[len(request_id)], ("a", 20), [1]]))
        _run(scheduler, worker)
    assert worker.encoded == [b"a"]
    assert (scheduler.encoder_cache.num_reads, scheduler.encoder_cache.num_hits) == (2, 1)


def test_a_chunk_that_splits_an_image_encodes_it_once_and_the_next_chunk_reads_it():
    scheduler = _scheduler(max_num_batched_tokens=16)
    worker = EncoderWorker(scheduler)
    scheduler.add_request(_request("r", [[1, 2, 3, 4], ("a", 30), [5, 6]]))
    plans = []
    while scheduler.has_unfinished_requests():
        plans.append(scheduler.schedule())
        scheduler.update_from_outcome(plans[-1], worker.execute(plans[-1]))
    assert [plan.num_scheduled_tokens["r"] for plan in plans[:3]] == [16, 16, 4]
    assert [[image.hash for image in plan.encoder_inputs] for plan in plans] == [[b"a"]] + [[]] * (len(plans) - 1)


def test_the_encoder_budget_cuts_a_chunk_before_an_image_it_cannot_encode_this_step():
    scheduler = _scheduler(max_num_encoder_input_tokens=30)
    worker = EncoderWorker(scheduler)
    scheduler.add_request(_request("r", [[1, 2], ("a", 20), [3], ("b", 20), [4]]))
    plan = scheduler.schedule()
    assert plan.num_scheduled_tokens == {"r": 23} and [image.hash for image in plan.encoder_inputs] == [b"a"]
    assert scheduler.encoder_cache.num_deferrals == 1
    scheduler.update_from_outcome(plan, worker.execute(plan))
    plan = scheduler.schedule()
    assert plan.num_scheduled_tokens == {"r": 21} and [image.hash for image in plan.encoder_inputs] == [b"b"]


def test_images_beyond_the_encoder_budget_wait_while_decodes_go_on():
    scheduler = _scheduler(max_num_encoder_input_tokens=20)
    worker = EncoderWorker(scheduler)
    scheduler.add_request(_request("decoding", [[1, 2, 3]], max_tokens=20, ignore_eos=True))
    plan = scheduler.schedule()
    scheduler.update_from_outcome(plan, worker.execute(plan))
    for i in range(4):
        scheduler.add_request(_request(f"image-{i}", [[7], (f"i{i}", 20), [8]]))
    for i in range(4):
        plan = scheduler.schedule()
        assert plan.num_scheduled_tokens["decoding"] == 1
        assert [image.hash for image in plan.encoder_inputs] == [f"i{i}".encode()]  # one image a step
        scheduler.update_from_outcome(plan, worker.execute(plan))


def test_an_unread_output_is_evicted_for_room_and_encoded_again_when_needed():
    scheduler = _scheduler(encoder_cache_size=40)
    worker = EncoderWorker(scheduler)
    for index, (request_id, name) in enumerate((("first", "a"), ("second", "b"), ("third", "c"), ("again", "a"))):
        scheduler.add_request(_request(request_id, [[5], (name, 20), [100 + index]]))
        _run(scheduler, worker)
    # c evicted a (the least recently read), a came back for "again" (its prefix hit ends inside the image)
    assert worker.encoded == [b"a", b"b", b"c", b"a"]
    assert worker.held == {b"c", b"a"}


def test_samples_of_an_image_prompt_fork_it_without_encoding_it_again():
    scheduler = _scheduler()
    worker = EncoderWorker(scheduler)
    scheduler.add_request(_request("r", [[1, 2], ("a", 20), [3, 4]], n=3, temperature=1.0, seed=0))
    _run(scheduler, worker)
    assert worker.encoded == [b"a"]


@pytest.mark.parametrize("steps_in_flight", [1, 3])
def test_preempted_requests_recompute_their_images_and_no_block_or_output_is_held_after(steps_in_flight):
    rng = random.Random(0)
    scheduler = _scheduler(num_blocks=12, max_num_batched_tokens=24, max_num_encoder_input_tokens=20,
                           encoder_cache_size=40)
    worker = EncoderWorker(scheduler, rng=rng)
    for i in range(12):
        parts = [[rng.randrange(1, 1000) for _ in range(rng.randrange(1, 20))]]
        for _ in range(rng.randrange(0, 3)):
            image = rng.randrange(6)
            parts += [(f"img{image}", 4 + 3 * image), [rng.randrange(1, 1000)]]
        names = [part[0] for part in parts if isinstance(part, tuple)]
        if len(names) == len(set(names)):  # an image's hash names one image: the same one is the same size
            scheduler.add_request(_request(f"r{i}", parts, max_tokens=rng.randrange(4, 20), ignore_eos=True))
    run_ahead(scheduler, worker, steps_in_flight)
    assert scheduler.num_preemptions > 0
    assert scheduler.block_manager.num_free_blocks == 12
    assert worker.held == scheduler.encoder_cache.held_hashes


@pytest.mark.parametrize("vision, change, message", [
    (None, {}, "images[0]: the model takes no images"),
    (VISION, {"offset": 2}, "images[0]: its placeholders (tokens 2 to 21) are not all the image token"),
    (VISION, {"offset": 10}, "images[0]: its placeholders (tokens 10 to 29) pass the prompt's end"),
    (VISION, {"grid_thw": (1, 2, 30)}, "images[0]: grid_thw [1, 2, 30] does not merge"),
    (VISION, {"pixel_shape": (80, 3)}, "images[0]: pixel_shape [80, 3] is not [80, 4]"),
    (VISION, {"pixel_values": b"\0" * 12}, "images[0]: pixel_values hold 12 bytes"),
    (VISION, {"hash": b""}, "images[0]: no hash"),
])
def test_bad_images_are_refused_naming_them(vision, change, message):
    request = _request("r", [[1], ("a", 20), [2]])
    request.images = (replace(request.images[0], **change),)
    with pytest.raises(InvalidArgument) as refused:
        _scheduler(vision=vision).add_request(request)
    assert str(refused.value).startswith(message)


def test_an_image_larger_than_the_encoder_budget_is_refused():
    with pytest.raises(InvalidArgument, match=r"images\[1\]: 21 placeholder tokens exceed"):
        _scheduler(max_num_encoder_input_tokens=20).add_request(_request("r", [[1], ("a", 20), ("b", 21)]))
