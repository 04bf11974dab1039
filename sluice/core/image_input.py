"""One image of a prompt as the model's image processor made it: what the router sends with a request, and the
scheduler and the worker carry (protos/sluice/v1/multimodal.proto's ImageInput)."""
import hashlib
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class ImageInput:
    pixel_values: bytes  # float32, little-endian, row-major [num_patches, patch_dim]
    pixel_shape: tuple[int, int]  # [num_patches, patch_dim]
    grid_thw: tuple[int, int, int]  # frames, rows and columns of patches
    offset: int  # the index of its first placeholder token in the prompt's token ids
    length: int  # its placeholder tokens (grid t * h * w / spatial_merge_size ** 2)
    hash: bytes  # of the processor's output (image_hash): the prefix and encoder caches' key

    @classmethod
    def placed(cls, pixel_values: bytes, pixel_shape: tuple[int, int], grid_thw: tuple[int, int, int], offset: int,
               length: int) -> "ImageInput":
        """The image at its placeholders, hashed."""
        return cls(pixel_values, pixel_shape, grid_thw, offset, length, image_hash(pixel_values, pixel_shape, grid_thw))


def image_hash(pixel_values: bytes, pixel_shape: tuple[int, ...], grid_thw: tuple[int, ...]) -> bytes:
    """The same pixels cut into the same grid hash the same, whichever front door the image came in by."""
    digest = hashlib.blake2b(digest_size=32)
    digest.update(",".join(map(str, (*pixel_shape, *grid_thw))).encode())
    digest.update(pixel_values)
    return digest.digest()
