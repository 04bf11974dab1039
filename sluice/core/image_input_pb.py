"""ImageInput to and from sluice.v1's message."""
from sluice.core.image_input import ImageInput
from sluice.v1 import multimodal_pb2 as pb


def image_input_to_pb(image: ImageInput) -> pb.ImageInput:
    return pb.ImageInput(pixel_values=image.pixel_values, pixel_shape=image.pixel_shape, grid_thw=image.grid_thw,
                         offset=image.offset, length=image.length, hash=image.hash)


def image_input_from_pb(message: pb.ImageInput) -> ImageInput:
    return ImageInput(message.pixel_values, tuple(message.pixel_shape), tuple(message.grid_thw), message.offset,
                      message.length, message.hash)
