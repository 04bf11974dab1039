"""ImageInput and VisionInfo to and from sluice.v1's messages (multimodal.proto)."""
from sluice.core.images import ImageInput, VisionInfo
from sluice.v1 import multimodal_pb2 as pb


def image_from_pb(message: pb.ImageInput) -> ImageInput:
    return ImageInput(message.hash, message.offset, message.length, tuple(message.grid_thw), message.pixel_values,
                      tuple(message.pixel_shape))


def image_to_pb(image: ImageInput) -> pb.ImageInput:
    return pb.ImageInput(hash=image.hash, offset=image.offset, length=image.length, grid_thw=image.grid_thw,
                         pixel_values=image.pixel_values, pixel_shape=image.pixel_shape)


def vision_info_from_pb(message: pb.VisionInfo) -> VisionInfo:
    return VisionInfo(message.image_token_id, message.spatial_merge_size, message.patch_dim)


def vision_info_to_pb(vision: VisionInfo) -> pb.VisionInfo:
    return pb.VisionInfo(image_token_id=vision.image_token_id, spatial_merge_size=vision.spatial_merge_size,
                         patch_dim=vision.patch_dim)
