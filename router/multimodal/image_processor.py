"""Images as a Qwen vision-language model's processor makes them: decoded by PIL, then resized to whole merged
patches between min and max pixels, normalised and cut into patches by transformers' Qwen2-VL image processor (its
PIL backend), set as the model folder's preprocessor_config.json sets it."""
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from sluice.core.errors import InvalidArgument
from sluice.router.chat import ChatImage


@dataclass(slots=True, frozen=True)
class ProcessedImage:
    pixel_values: np.ndarray  # float32 [num_patches, patch_dim]
    grid_thw: tuple[int, int, int]  # frames, rows and columns of patches


class ImageProcessor:
    def __init__(self, model_path: Path, max_pixels: int):
        """max_pixels: a larger image is scaled down to it, where the model's own max_pixels is not lower."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self._hf = Qwen2VLImageProcessorPil.from_pretrained(model_path)
        size = self._hf.size
        self._size = {"shortest_edge": min(size.shortest_edge, max_pixels),
                      "longest_edge": min(size.longest_edge, max_pixels)}
        self.merge_size: int = self._hf.merge_size
        self.patch_size: int = self._hf.patch_size

    def process(self, image: ChatImage) -> ProcessedImage:
        processed = self._hf.preprocess([_decoded(image)], size=self._size)
        grid_thw = tuple(int(n) for n in processed["image_grid_thw"][0])
        return ProcessedImage(np.ascontiguousarray(processed["pixel_values"], dtype="<f4"), grid_thw)


def _decoded(image: ChatImage) -> Image.Image:
    if image.media_type and not image.media_type.startswith("image/"):
        raise InvalidArgument(image.field, f"the media type {image.media_type!r} is not an image's")
    try:
        decoded = Image.open(io.BytesIO(image.data))
    except Exception as error:  # PIL raises many kinds on bad data
        raise InvalidArgument(image.field, f"the image cannot be decoded: {error}") from error
    if decoded.width * decoded.height > Image.MAX_IMAGE_PIXELS:
        raise InvalidArgument(image.field, f"the image has {decoded.width} x {decoded.height} pixels; at most "
                                           f"{Image.MAX_IMAGE_PIXELS} are decoded")
    try:
        decoded.load()
    except Exception as error:
        raise InvalidArgument(image.field, f"the image cannot be decoded: {error}") from error
    return decoded
