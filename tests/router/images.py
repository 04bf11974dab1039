"""Encoded test images of random pixels, and a chat message that holds them."""
import io

import numpy as np
from PIL import Image

from sluice.v1 import generation_pb2 as pb


def png(height: int, width: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def user_message(*parts: str | bytes) -> pb.ChatMessage:
    """A user message of text (str) and PNG images (bytes) parts, in order."""
    return pb.ChatMessage(role="user", parts=[
        pb.ContentPart(text=part) if isinstance(part, str)
        else pb.ContentPart(image=pb.Image(data=part, media_type="image/png")) for part in parts])
