"""sluice.v1's ChatMessages as a Chat. A message's parts without an image become its content, the texts joined by
newlines (as vLLM joins them for a template that reads strings); parts with an image stay parts."""
from sluice.core.errors import InvalidArgument
from sluice.router.chat import Chat, ChatImage
from sluice.router.validation import validate_chat_roles
from sluice.v1 import generation_pb2 as pb


def chat_from_pb(chat: pb.ChatMessages) -> Chat:
    validate_chat_roles([message.role for message in chat.messages])
    result = Chat()
    for index, message in enumerate(chat.messages):
        field = f"chat.messages[{index}]"
        if not message.parts:
            result.messages.append({"role": message.role, "content": message.content})
            continue
        if message.content:
            raise InvalidArgument(field, "set content or parts, not both")
        parts = [_part(part, f"{field}.parts[{part_index}]", result.images)
                 for part_index, part in enumerate(message.parts)]
        if all(part["type"] == "text" for part in parts):
            result.messages.append({"role": message.role, "content": "\n".join(part["text"] for part in parts)})
        else:
            result.messages.append({"role": message.role, "content": parts})
    return result


def _part(part: pb.ContentPart, field: str, images: list[ChatImage]) -> dict:
    kind = part.WhichOneof("kind")
    if kind == "text":
        return {"type": "text", "text": part.text}
    if kind != "image":
        raise InvalidArgument(field, "set text or image")
    if not part.image.data:
        raise InvalidArgument(field, "the image has no data")
    images.append(ChatImage(part.image.data, part.image.media_type, field))
    return {"type": "image"}
