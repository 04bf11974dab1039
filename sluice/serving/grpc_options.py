"""Explicit message-size, keepalive and reconnect settings, the same on both ends of every hop."""
MAX_REQUEST_PIXEL_BYTES = 256 * 1024 * 1024  # a request's images as pixel values, at most (the router's limits)
MAX_MESSAGE_BYTES = 4 * MAX_REQUEST_PIXEL_BYTES  # room for a step that brings a few such requests to the workers
MAX_CLIENT_REQUEST_BYTES = 4 * 1024 * 1024  # the router's default bound on one client message (gRPC's own default)

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_reconnect_backoff_ms", 2_000),  # a peer that restarts is found within 2 s of listening again
]


def server_options(max_receive_message_bytes: int = MAX_MESSAGE_BYTES,
                   share_port: bool = False) -> list[tuple[str, int]]:
    """A larger message than max_receive_message_bytes is refused with RESOURCE_EXHAUSTED before it is parsed. With
    share_port, processes serving the same port (SO_REUSEPORT) each take a share of its new connections; without,
    a second server on a taken port fails to start instead of sharing its connections."""
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", max_receive_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.so_reuseport", int(share_port)),
    ]
