"""Unary requests decoded inside the method rather than by grpc's deserializer, so a message that does not parse
(truncated, corrupt, a string field that is not UTF-8) is an InvalidArgument naming the field where it can, not an
exception the client sees as UNKNOWN."""
import grpc
from google.protobuf import empty_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from sluice.core.errors import InvalidArgument

_LENGTH_DELIMITED = 2  # the wire type of strings and messages


def decoded_in_behavior(handler: grpc.RpcMethodHandler, request_type: Descriptor) -> grpc.RpcMethodHandler:
    """The handler taking its request as bytes and decoding it first; a request-streaming one as it is."""
    if handler.request_streaming:
        return handler
    parse = handler.request_deserializer

    def decode(data: bytes):
        try:
            return parse(data)
        except DecodeError as error:
            field = invalid_utf8_field(request_type, data)
            if field is not None:
                raise InvalidArgument(field, "not valid UTF-8") from error
            raise InvalidArgument("request", f"not a valid {request_type.full_name}: truncated or corrupt") \
                from error

    if handler.response_streaming:
        async def streaming(data: bytes, context):
            async for response in handler.unary_stream(decode(data), context):
                yield response

        return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=handler.response_serializer)

    async def unary(data: bytes, context):
        return await handler.unary_unary(decode(data), context)

    return grpc.unary_unary_rpc_method_handler(unary, response_serializer=handler.response_serializer)


def invalid_utf8_field(message_type: Descriptor, data: bytes) -> str | None:
    """The path (e.g. "sampling.regex") of the first string field of the encoded message whose bytes are not UTF-8,
    or None when there is none or the message does not parse at all."""
    fields = empty_pb2.Empty()
    try:
        fields.ParseFromString(data)  # every field is unknown to Empty: kept as raw bytes, not checked
    except DecodeError:
        return None
    for unknown in UnknownFieldSet(fields):
        field = message_type.fields_by_number.get(unknown.field_number)
        if field is None or unknown.wire_type != _LENGTH_DELIMITED:
            continue
        if field.type == FieldDescriptor.TYPE_STRING and not _is_utf8(unknown.data):
            return field.name
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            inner = invalid_utf8_field(field.message_type, unknown.data)
            if inner is not None:
                return f"{field.name}.{inner}"
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
