"""A tiny random Qwen2.5-VL served through the real scheduler and worker, its images made by transformers' image
processor and submitted on the scheduler's Connect stream as a router sends them: greedy tokens identical to
transformers' for prompts of 0, 1 and 2 images of different sizes, alone and 8 at once over a KV pool too small for
them (preemption), with a token budget that splits images' placeholders across steps and an encoder budget below two
images' tokens; a repeat of an image and its text hits the prefix cache, another image after the same text hits it
only before the image; greedy samples of an n = 3 request fork it; a bad image is refused naming it; no KV block is
left held."""
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.served_images import (PROMPT_IMAGES, TEXT, VisionTokens, assert_eight_at_once_match_hf,
                                     assert_no_block_held, hf_image_greedy, image_prompt, processed_images, served,
                                     submit, tiny_checkpoint)
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
SCHEDULER_ARGS = ["--num-blocks", "10", "--block-size", str(BLOCK_SIZE), "--max-num-batched-tokens", "32",
                  "--max-num-encoder-input-tokens", "15", "--encoder-cache-size", "32"]


@pytest.fixture(scope="module")
def model(tmp_path_factory, default_model_dir):
    """(the checkpoint folder, transformers' model of it)."""
    return tiny_checkpoint(tmp_path_factory.mktemp("tiny_qwen2_5_vl"), default_model_dir)


@pytest.fixture(scope="module")
def services(model):
    with running_services(model[0], SCHEDULER_ARGS) as running:
        yield running


@pytest.fixture(scope="module")
def processed():
    return processed_images()


def test_model_info_tells_what_the_model_expects_of_images(services, model):
    vision = services.client.model_info().vision
    assert (vision.image_token_id, vision.spatial_merge_size, vision.patch_dim) == (model[1].config.image_token_id, 2, 3 * 2 * 2 * 2)


def test_prompts_of_0_1_and_2_images_alone_match_hf(services, model, processed):
    """A chunk reaching a small image and a tall one (16 tokens) stops before the tall one, which a later step
    encodes."""
    for index, names in enumerate(PROMPT_IMAGES):
        ids, images = image_prompt(VisionTokens.of(model[1].config), TEXT, names, processed)
        result = served(services, [submit(f"alone-{index}", ids, images)])[f"alone-{index}"]
        assert result["tokens"] == hf_image_greedy(model[1], ids, names, processed), names
    assert _scheduler_counter(services, "sluice:encoder_deferrals") > 0
    assert_no_block_held(services)


def test_eight_at_once_over_a_small_pool_match_hf(services, model, processed):
    """Eight prompts of ~3 blocks each over a pool of 10 (preemption), 32 tokens a step (a chunk ends inside an
    image) and 15 image tokens encoded a step (no two images of a chunk encode in one step); prompts of the same
    image read its output while the worker holds it."""
    preemptions, hits = services.load().num_preemptions, _scheduler_counter(services, "sluice:encoder_cache_hits")
    assert_eight_at_once_match_hf(services, model[1], processed)
    assert services.load().num_preemptions > preemptions
    assert _scheduler_counter(services, "sluice:encoder_cache_hits") > hits


def test_greedy_samples_of_an_image_prompt_match_hf(services, model, processed):
    """Three samples fork the first's prompt, images and all, under the small pool and budgets."""
    ids, images = image_prompt(VisionTokens.of(model[1].config), TEXT, ["tall", "wide"], processed)
    result = served(services, [submit("samples", ids, images, n=3)])["samples"]
    assert result["samples"] == [hf_image_greedy(model[1], ids, ["tall", "wide"], processed)] * 3
    assert_no_block_held(services)


def test_prefix_cache_holds_an_image_and_its_text_but_not_another_image(services, model, processed):
    text = [2000 + 3 * i for i in range(20)]  # text no earlier prompt has
    ids, images = image_prompt(VisionTokens.of(model[1].config), text, ["wide"], processed)
    first = served(services, [submit("first", ids, images)])["first"]
    repeat = served(services, [submit("repeat", ids, images)])["repeat"]
    other_ids, other_images = image_prompt(VisionTokens.of(model[1].config), text, ["wide2"], processed)  # the same placeholder tokens, another image
    other = served(services, [submit("other", other_ids, other_images)])["other"]
    assert first["tokens"] == repeat["tokens"] == hf_image_greedy(model[1], ids, ["wide"], processed)
    assert other["tokens"] == hf_image_greedy(model[1], other_ids, ["wide2"], processed)
    assert first["cached_tokens"] == 0
    assert repeat["cached_tokens"] >= images[0].offset + images[0].length - BLOCK_SIZE  # through the image's blocks
    assert other["cached_tokens"] == images[0].offset // BLOCK_SIZE * BLOCK_SIZE  # the text's whole blocks
    assert_no_block_held(services)


def _scheduler_counter(services, name: str) -> float:
    with urllib.request.urlopen(services.metrics_url("scheduler"), timeout=5) as response:
        families = text_string_to_metric_families(response.read().decode())
        return next(sample.value for family in families if family.name == name for sample in family.samples)


def test_an_image_whose_pixels_do_not_match_its_grid_is_refused_naming_it(services, model, processed):
    ids, images = image_prompt(VisionTokens.of(model[1].config), TEXT, ["small", "tall"], processed)
    images[1].pixel_shape[:] = [images[1].pixel_shape[0] - 1, images[1].pixel_shape[1]]
    result = served(services, [submit("bad", ids, images)])["bad"]
    assert result["status"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert result["message"].startswith("images[1]: pixel_shape")
    assert_no_block_held(services)
