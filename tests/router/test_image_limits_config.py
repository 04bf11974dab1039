"""The router's image limits: a request's images as pixel values must fit the hops after the router, and the router
reads client messages large enough for them only where the model takes images."""
import pytest

from sluice.router.config import PIXEL_VALUE_BYTES, RouterConfig
from sluice.serving.grpc_options import MAX_MESSAGE_BYTES, MAX_REQUEST_PIXEL_BYTES


def test_the_default_limits_fit_a_message_between_the_services():
    config = RouterConfig()
    assert config.max_pixel_bytes_per_request <= MAX_REQUEST_PIXEL_BYTES < MAX_MESSAGE_BYTES
    assert config.max_receive_bytes(takes_images=False) == config.max_request_bytes
    assert config.max_receive_bytes(takes_images=True) == config.max_request_bytes + config.max_pixel_bytes_per_request


def test_limits_whose_pixel_values_pass_a_requests_share_are_refused():
    pixels = MAX_REQUEST_PIXEL_BYTES // PIXEL_VALUE_BYTES
    RouterConfig(max_images_per_request=1, max_image_pixels=pixels)
    with pytest.raises(ValueError, match="bytes of pixel values"):
        RouterConfig(max_images_per_request=2, max_image_pixels=pixels)


@pytest.mark.parametrize("name", ["max_images_per_request", "max_image_pixels", "max_image_bytes_per_request"])
def test_a_limit_below_1_is_refused(name):
    with pytest.raises(ValueError, match=name):
        RouterConfig(**{name: 0})
