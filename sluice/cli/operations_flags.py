"""Command-line options every service shares (drain, metrics) and the router's access options (auth, TLS)."""
from pathlib import Path

import grpc

from sluice.core.options import add_options, as_flags, option_values
from sluice.serving.auth import BearerTokenAuth
from sluice.serving.operations import Operations


def add_operations_options(parser) -> None:
    add_options(parser, Operations)


def operations_flags(args, metrics_port_offset: int) -> list[str]:
    """The operations options again as flags, for `sluice serve` to pass on; each service gets its own metrics port."""
    values = option_values(args, Operations)
    if values["metrics_port"] is not None:
        values["metrics_port"] += metrics_port_offset
    return as_flags(values, Operations)


def operations_from(args, tracing: bool) -> Operations:
    return Operations(**option_values(args, Operations), tracing=tracing)


def add_access_options(parser) -> None:
    parser.add_argument("--auth-token", help="require 'authorization: Bearer <token>' (default: $SLUICE_AUTH_TOKEN)")
    parser.add_argument("--tls-cert", type=Path, help="serve TLS with this PEM certificate chain")
    parser.add_argument("--tls-key", type=Path, help="the PEM private key of --tls-cert")


def access_flags(args) -> list[str]:
    flags = ["--auth-token", args.auth_token] if args.auth_token else []
    if args.tls_cert is not None:
        flags += ["--tls-cert", str(args.tls_cert), "--tls-key", str(args.tls_key)]
    return flags


def access_from(args, auth_token: str | None) -> tuple[list[grpc.aio.ServerInterceptor], grpc.ServerCredentials | None]:
    """The interceptors and server credentials that the access options ask for."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("--tls-cert and --tls-key go together")
    interceptors = [BearerTokenAuth(auth_token)] if auth_token else []
    credentials = None
    if args.tls_cert is not None:
        credentials = grpc.ssl_server_credentials([(args.tls_key.read_bytes(), args.tls_cert.read_bytes())])
    return interceptors, credentials
