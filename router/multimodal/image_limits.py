"""The router's bounds on a request's images (RouterConfig's flags), checked before any image is decoded."""
from sluice.core.errors import InvalidArgument
from sluice.router.chat import ChatImage
from sluice.router.config import RouterConfig


def check_encoded_images(images: list[ChatImage], config: RouterConfig) -> None:
    """The native API's images: how many, and their encoded bytes together."""
    if len(images) > config.max_images_per_request:
        raise InvalidArgument(images[config.max_images_per_request].field,
                              f"at most {config.max_images_per_request} images a request")
    total = 0
    for image in images:
        total += len(image.data)
        if total > config.max_image_bytes_per_request:
            raise InvalidArgument(image.field, f"the request's images pass {config.max_image_bytes_per_request} "
                                               "bytes here")


def check_preprocessed_images(pixels_per_image: list[int], config: RouterConfig, field: str) -> None:
    """A gateway's preprocessed images: how many, and each one's pixels (its grid's patches' pixels)."""
    if len(pixels_per_image) > config.max_images_per_request:
        raise InvalidArgument(field, f"{len(pixels_per_image)} images; at most {config.max_images_per_request} a "
                                     "request")
    for index, pixels in enumerate(pixels_per_image):
        if pixels > config.max_image_pixels:
            raise InvalidArgument(f"{field}[{index}]", f"the image has {pixels} pixels; at most "
                                                       f"{config.max_image_pixels}")
