"""A chat as the router's logic sees it: messages as chat templates read them (content a string, or a list of
{"type": "text", "text": ...} and {"type": "image"} parts), and the images' encoded bytes in the order of their
parts."""
from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class ChatImage:
    data: bytes
    media_type: str  # empty: whatever the data is
    field: str  # the part that holds it, as an error names it: "chat.messages[1].parts[0]"


@dataclass(slots=True)
class Chat:
    messages: list[dict] = field(default_factory=list)
    images: list[ChatImage] = field(default_factory=list)
