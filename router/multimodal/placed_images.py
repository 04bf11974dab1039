"""An image the model's processor made, placed at its placeholders in the prompt and hashed: the same pixels cut into
the same grid hash the same, whichever front door the image came in by."""
import hashlib

from sluice.core.images import ImageInput


def placed_image(pixel_values: bytes, pixel_shape: tuple[int, int], grid_thw: tuple[int, int, int], offset: int,
                 length: int) -> ImageInput:
    return ImageInput(_image_hash(pixel_values, pixel_shape, grid_thw), offset, length, grid_thw, pixel_values,
                      pixel_shape)


def _image_hash(pixel_values: bytes, pixel_shape: tuple[int, ...], grid_thw: tuple[int, ...]) -> bytes:
    digest = hashlib.blake2b(digest_size=32)
    digest.update(",".join(map(str, (*pixel_shape, *grid_thw))).encode())
    digest.update(pixel_values)
    return digest.digest()
