"""Encoded test images of random pixels, and a chat message that holds them."""
from sluice.cli.bench.image_workload import random_png
from sluice.v1 import generation_pb2 as pb


def png(height: int, width: int, seed: int = 0) -> bytes:
    return random_png(width, height, seed)


def user_message(*parts: str | bytes) -> pb.ChatMessage:
    """A user message of text (str) and PNG images (bytes) parts, in order."""
    return pb.ChatMessage(role="user", parts=[
        pb.ContentPart(text=part) if isinstance(part, str)
        else pb.ContentPart(image=pb.Image(data=part, media_type="image/png")) for part in parts])
