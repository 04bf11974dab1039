"""The checks a request's images must pass before it may wait: a model that takes images, placeholders that are
prompt tokens of the image token, one after the other, pixels of the grid's shape, and an encoding that fits one
step's encoder budget and the encoder cache."""
from math import prod

from sluice.core.errors import InvalidArgument
from sluice.core.images import ImageInput, VisionInfo
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.request import Request


def validate_images(request: Request, vision: VisionInfo | None, config: SchedulerConfig) -> None:
    if request.images and vision is None:
        raise InvalidArgument("images[0]", "the model takes no images (it has no vision tower)")
    previous_end = 0
    for index, image in enumerate(request.images):
        reason = _placement_error(image, request.prompt_token_ids, previous_end, vision) \
            or _pixels_error(image, vision) or _size_error(image, config)
        if reason is not None:
            raise InvalidArgument(f"images[{index}]", reason)
        previous_end = image.end


def _placement_error(image: ImageInput, prompt: list[int], previous_end: int, vision: VisionInfo) -> str | None:
    if not image.hash:
        return "no hash"
    if image.length < 1:
        return "no placeholder tokens"
    if image.offset < previous_end:
        return f"its placeholders start at token {image.offset}, before the previous image's end ({previous_end})"
    if image.end > len(prompt):
        return f"its placeholders (tokens {image.offset} to {image.end - 1}) pass the prompt's end ({len(prompt)})"
    if any(token != vision.image_token_id for token in prompt[image.offset:image.end]):
        return (f"its placeholders (tokens {image.offset} to {image.end - 1}) are not all the image token "
                f"({vision.image_token_id})")
    return None


def _pixels_error(image: ImageInput, vision: VisionInfo) -> str | None:
    if len(image.grid_thw) != 3 or min(image.grid_thw) < 1:
        return f"grid_thw {list(image.grid_thw)} is not 3 positive sizes"
    num_patches = prod(image.grid_thw)
    rows, columns = image.grid_thw[1:]
    merge = vision.spatial_merge_size
    if rows % merge or columns % merge or image.length * merge**2 != num_patches:
        return (f"grid_thw {list(image.grid_thw)} does not merge into its {image.length} placeholders "
                f"({merge} x {merge} patches each)")
    if list(image.pixel_shape) != [num_patches, vision.patch_dim]:
        return f"pixel_shape {list(image.pixel_shape)} is not [{num_patches}, {vision.patch_dim}]"
    if len(image.pixel_values) != 4 * num_patches * vision.patch_dim:
        return f"pixel_values hold {len(image.pixel_values)} bytes, not float32 values of pixel_shape"
    return None


def _size_error(image: ImageInput, config: SchedulerConfig) -> str | None:
    limit = min(config.max_num_encoder_input_tokens, config.encoder_cache_size)
    if image.length > limit:
        return (f"{image.length} placeholder tokens exceed what one step encodes (max_num_encoder_input_tokens "
                f"{config.max_num_encoder_input_tokens}) or the encoder cache holds ({config.encoder_cache_size})")
    return None
