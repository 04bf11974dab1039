"""Hand-made protobuf wire bytes, for requests a client library would refuse to build: a field appended to a
serialized message wins over the one before it (strings) or merges into it (messages)."""


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """One string or message field: its tag (wire type 2), its length and its bytes."""
    return varint(field_number << 3 | 2) + varint(len(payload)) + payload


def nested(path: list[int], payload: bytes) -> bytes:
    """The payload at a path of field numbers, e.g. [5, 20] for GenerateRequest.sampling.regex."""
    for field_number in reversed(path):
        payload = length_delimited(field_number, payload)
    return payload
