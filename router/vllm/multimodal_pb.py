"""vLLM's MultimodalInputs, as smg sends them for a Qwen vision-language model, as the router's ImageInputs: the
images smg preprocessed (float32 pixel_values of all images, a row per patch, image_grid_thw a row per image) cut
per image, at their placeholder ranges in the prompt, hashed as the native API hashes them."""
import math

import numpy as np
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from sluice.core.errors import InvalidArgument
from sluice.core.images import ImageInput
from sluice.router.config import RouterConfig
from sluice.router.multimodal.image_limits import check_preprocessed_images
from sluice.router.multimodal.placed_images import placed_image
from sluice.router.multimodal.vision_prompts import VisionPrompts

_FIELD = "mm_inputs"
_INTEGERS = ("int64", "int32", "uint32")


def images_from_vllm_pb(inputs: vllm.MultimodalInputs, vision: VisionPrompts, config: RouterConfig,
                        token_ids: list[int]) -> list[ImageInput]:
    if inputs.modality not in (common_pb2.MODALITY_UNSPECIFIED, common_pb2.IMAGE):
        raise InvalidArgument(f"{_FIELD}.modality", "only images are supported")
    grids = _tensor(inputs.model_specific_tensors.get("image_grid_thw"), "image_grid_thw", _INTEGERS)
    if grids.ndim != 2 or grids.shape[1] != 3 or (grids < 1).any():
        raise InvalidArgument(f"{_FIELD}.model_specific_tensors[image_grid_thw]", "a row of frames, rows and columns "
                                                                                 "of patches (each >= 1) per image")
    processor = vision.processor
    check_preprocessed_images([int(h * w) * processor.patch_size ** 2 for _, h, w in grids], config,
                              f"{_FIELD}.model_specific_tensors[image_grid_thw]")
    pixels = _tensor(inputs.pixel_values, "pixel_values", ("float32",))
    patches_per_image = [math.prod(grid) for grid in grids.tolist()]
    if pixels.ndim != 2 or len(pixels) != sum(patches_per_image):
        raise InvalidArgument(f"{_FIELD}.pixel_values", f"shape {list(pixels.shape)} is not a row for each of the "
                                                        f"images' {sum(patches_per_image)} patches")
    placeholders = inputs.mm_placeholders
    if len(placeholders) != len(grids):
        raise InvalidArgument(f"{_FIELD}.mm_placeholders", f"{len(placeholders)} ranges for {len(grids)} images")
    images = []
    starts = np.cumsum([0, *patches_per_image])
    for index, (grid, placeholder) in enumerate(zip(grids.tolist(), placeholders)):
        length = math.prod(grid) // processor.merge_size ** 2
        placed = token_ids[placeholder.offset:placeholder.offset + placeholder.length]
        if placeholder.length != length or placed != [vision.image_token_id] * length:
            raise InvalidArgument(f"{_FIELD}.mm_placeholders[{index}]", f"image {index} of grid {grid} takes {length} "
                                                                        f"image tokens ({vision.image_token_id}) of "
                                                                        "the prompt")
        rows = np.ascontiguousarray(pixels[starts[index]:starts[index + 1]])
        images.append(placed_image(rows.tobytes(), tuple(rows.shape), tuple(grid), placeholder.offset, length))
    return images


def _tensor(tensor: vllm.TensorData | None, name: str, dtypes: tuple[str, ...]) -> np.ndarray:
    field = f"{_FIELD}.{name}"
    if tensor is None or tensor.WhichOneof("payload") != "inline":
        raise InvalidArgument(field, "send the tensor inline")
    if tensor.dtype not in dtypes:
        raise InvalidArgument(field, f"dtype {tensor.dtype!r}; one of {', '.join(dtypes)} expected")
    values = np.frombuffer(tensor.inline, dtype=np.dtype(tensor.dtype).newbyteorder("<"))
    if len(values) != math.prod(tensor.shape):
        raise InvalidArgument(field, f"{len(values)} values for shape {list(tensor.shape)}")
    return values.reshape(tuple(tensor.shape))
