"""The router's settings."""
from dataclasses import dataclass

from sluice.core.options import option
from sluice.serving.grpc_options import MAX_CLIENT_REQUEST_BYTES, MAX_REQUEST_PIXEL_BYTES

# float32 RGB repeated over a temporal patch of 2 frames: what one pixel of an image becomes in Qwen-VL's pixel_values
PIXEL_VALUE_BYTES = 3 * 2 * 4


@dataclass(slots=True)
class RouterConfig:
    max_request_bytes: int = option(MAX_CLIENT_REQUEST_BYTES,
                                    help="a larger client message gets RESOURCE_EXHAUSTED before it is read (for a "
                                         "model that takes images, its images come on top)")
    max_images_per_request: int = option(8, help="a request with more images gets INVALID_ARGUMENT")
    max_image_pixels: int = option(28 * 28 * 1280, help="an image's pixels after resizing: the image processor "
                                                        "scales a larger one down (where the model's own max_pixels "
                                                        "is not lower); one that comes preprocessed larger is refused")
    max_image_bytes_per_request: int = option(32 * 1024 * 1024,
                                              help="a request's encoded images together; more gets INVALID_ARGUMENT")

    def __post_init__(self):
        for name in ("max_request_bytes", "max_images_per_request", "max_image_pixels",
                     "max_image_bytes_per_request"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_pixel_bytes_per_request > MAX_REQUEST_PIXEL_BYTES:
            raise ValueError(f"max_images_per_request x max_image_pixels makes {self.max_pixel_bytes_per_request} "
                             f"bytes of pixel values; the services carry at most {MAX_REQUEST_PIXEL_BYTES} a request")

    @property
    def max_pixel_bytes_per_request(self) -> int:
        return self.max_images_per_request * self.max_image_pixels * PIXEL_VALUE_BYTES

    def max_receive_bytes(self, takes_images: bool) -> int:
        """The largest client message read: a request, plus, for a model that takes images, its images encoded (the
        native API) or as pixel values (a gateway's preprocessed ones)."""
        if not takes_images:
            return self.max_request_bytes
        return self.max_request_bytes + max(self.max_image_bytes_per_request, self.max_pixel_bytes_per_request)
