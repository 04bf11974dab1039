"""Images of a prompt as a model's image processor made them, which the scheduler carries from the router to the
worker, and what a model that takes images expects of them."""
from dataclasses import dataclass, replace


@dataclass(slots=True, frozen=True)
class ImageInput:
    hash: bytes  # of the image's content and the processor's output: the prefix and encoder caches' key
    offset: int  # the index of its first placeholder token in the prompt's token ids
    length: int  # its placeholder tokens, which its encoder output's rows replace
    grid_thw: tuple[int, ...]  # frames, rows and columns of patches
    pixel_values: bytes = b""  # float32, little-endian, row-major [pixel_shape]; empty where none is needed
    pixel_shape: tuple[int, ...] = ()  # [num_patches, patch_dim]

    @property
    def end(self) -> int:
        """The index after its last placeholder token."""
        return self.offset + self.length

    def without_pixels(self) -> "ImageInput":
        return replace(self, pixel_values=b"", pixel_shape=())


@dataclass(slots=True, frozen=True)
class VisionInfo:
    image_token_id: int  # the placeholder token of an image's embeddings
    spatial_merge_size: int  # patches a side of one placeholder merges
    patch_dim: int  # the values of one patch in pixel_values
