"""The `sluice` command. Environment variables are read only here and in model_store (the cache folder)."""
import argparse
import asyncio
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from sluice.cli.bench.commands import add_bench_commands
from sluice.cli.compile_cache import use_compile_cache
from sluice.cli.generate_command import add_generate_command
from sluice.cli.model_store import cache_dir, default_model
from sluice.cli.operations_flags import (access_flags, access_from, add_access_options, add_operations_options,
                                         operations_flags, operations_from)
from sluice.cli.service_flags import (add_router_options, add_router_process_options, add_scheduler_options,
                                      add_worker_options, router_config, router_flags, scheduler_flags,
                                      scheduler_options, worker_config, worker_flags)
from sluice.core.options import as_flags
from sluice.serving.operations import Operations

_DEFAULT_ROUTER_ADDRESS = "127.0.0.1:50051"
log = logging.getLogger("sluice.cli")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="An LLM inference server over gRPC.")
    parser.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)
    _add_fetch_model(commands)
    _add_serve(commands)
    _add_worker(commands)
    _add_scheduler(commands)
    _add_router(commands)
    add_generate_command(commands, os.environ.get("SLUICE_ADDRESS", _DEFAULT_ROUTER_ADDRESS),
                         os.environ.get("SLUICE_AUTH_TOKEN"))
    add_bench_commands(commands)
    return parser


def _add_fetch_model(commands) -> None:
    command = commands.add_parser("fetch-model", help="download the default model into the cache folder")
    command.set_defaults(run=lambda args: print(default_model()))


def _add_serve(commands) -> None:
    command = commands.add_parser("serve", help="start router, scheduler and worker, and restart any that exits; "
                                                "Ctrl-C or SIGTERM stops them in order, once requests in flight end")
    command.add_argument("--host", default="127.0.0.1")
    command.add_argument("--port", type=int, default=50051, help="the router's port")
    add_router_process_options(command)
    command.add_argument("--startup-timeout", type=float, default=600.0)
    command.add_argument("--openai-port", type=int,
                         help="also serve the OpenAI and Anthropic APIs over HTTP on this port, through smg "
                              "(pip install 'sluice[gateway]')")
    command.add_argument("--openai-metrics-port", type=int, default=29000, help="the gateway's Prometheus port")
    command.add_argument("--pd", action="store_true",
                         help="prefill/decode disaggregation: a prefill replica and a decode replica (each of "
                              "-tp ranks), KV blocks moved between them over NIXL, and routers that pair them")
    add_worker_options(command, with_scheduler=True)
    add_scheduler_options(command)
    add_router_options(command)
    add_operations_options(command)
    add_access_options(command)
    command.set_defaults(run=_serve)


def _serve(args) -> None:
    """Stops on a signal as serve_stop says: exit code 0 once every service has stopped on its own, else 1."""
    from sluice.cli.dummy_folder import router_model_flags
    from sluice.cli.gateway import GatewayLayout, gateway_command, wait_until_gateway_serves
    from sluice.cli.launcher import (KeptService, RestartBackoff, ServeLayout, keep_running, start_services,
                                     wait_until_routers_serve)
    from sluice.cli.serve_stop import StopRequested, StopSignals, stop_in_stages

    args.model = args.model or str(default_model())
    gateway = GatewayLayout(args.host, args.openai_port, args.openai_metrics_port) if args.openai_port else None
    if gateway is not None and (args.auth_token or args.tls_cert):
        raise SystemExit("--openai-port: smg presents no token or TLS client setup to its workers; drop "
                         "--auth-token and --tls-cert and secure the gateway's HTTP port instead")
    if args.pd and args.kv_role != "both":
        raise SystemExit("--pd sets each replica's --kv-role itself")
    num_ranks = args.tensor_parallel_size * args.pipeline_parallel_size
    layout = ServeLayout.on_free_ports(args.host, args.port, num_ranks, args.router_processes, args.pd)
    router = [*router_model_flags(args.load_format, args.model, cache_dir()), *access_flags(args),
              *router_flags(args)]
    # metrics ports: router, scheduler, the worker's ranks, the other routers, then a prefill replica's scheduler and
    # worker ranks
    worker, scheduler, prefill_worker, prefill_scheduler = (
        operations_flags(args, metrics_port_offset=offset)
        for offset in (2, 1, num_ranks + args.router_processes + 2, num_ranks + args.router_processes + 1))
    routers = [operations_flags(args, metrics_port_offset=0 if i == 0 else 1 + num_ranks + i)
               for i in range(args.router_processes)]
    signals = StopSignals()
    processes = start_services(layout, [*worker_flags(args), *worker], [*scheduler_flags(args), *scheduler],
                               [[*router, *operations] for operations in routers], own_sessions=True,
                               prefill_args=([*worker_flags(args), *prefill_worker],
                                             [*scheduler_flags(args), *prefill_scheduler]))
    kept = [KeptService(p, RestartBackoff()) for p in processes]
    worker_service, scheduler_service = kept[:2]
    router_services, prefill_services = kept[2:2 + args.router_processes], kept[2 + args.router_processes:]
    gateway_services = []
    try:
        with signals.interrupting():
            wait_until_routers_serve(layout, args.startup_timeout, processes)
        print(f"sluice is serving {Path(args.model).name} on {layout.router_address}", flush=True)
        if gateway is not None:
            drain = ["--shutdown-grace-period-secs", str(math.ceil(args.drain_timeout))]
            smg = subprocess.Popen(gateway_command(gateway, layout.router_process_addresses, Path(args.model), drain),
                                   start_new_session=True)
            gateway_services.append(KeptService(smg, RestartBackoff(), name="gateway"))
            with signals.interrupting():
                wait_until_gateway_serves(gateway, args.startup_timeout, smg)
            print(f"the OpenAI API is on {gateway.url}/v1", flush=True)
        keep_running([worker_service, scheduler_service, *router_services, *prefill_services, *gateway_services],
                     until=lambda: signals.requested)
    except StopRequested:
        pass
    finally:
        stopped = stop_in_stages([gateway_services, router_services, [scheduler_service, *prefill_services[1:]],
                                  [worker_service, *prefill_services[:1]]], args.drain_timeout,
                                 forced=lambda: signals.forced)
    sys.exit(0 if stopped else 1)


def _add_worker(commands) -> None:
    command = commands.add_parser("worker", help="run one worker (data plane), or with -tp N -pp P the N x P ranks "
                                                 "of one model replica")
    command.add_argument("--listen", default="127.0.0.1:50053",
                         help="HOST:PORT; for -tp N -pp P without --rank, one address per rank (comma-separated, "
                              "rank order) or one HOST:PORT for ports PORT..PORT+N*P-1")
    command.add_argument("--rank", type=int,
                         help="run only this rank: tensor-parallel rank RANK %% N of pipeline stage RANK // N (the "
                              "ranks meet at --dist-init-address)")
    command.add_argument("--pp-rank", type=int,
                         help="run only this pipeline stage's -tp ranks (ranks PP_RANK * N .. PP_RANK * N + N - 1), "
                              "meeting the other stages' at --dist-init-address: one host per stage")
    command.add_argument("--dist-init-address", help="HOST:PORT where rank 0 listens for the other ranks")
    add_worker_options(command)
    add_operations_options(command)
    command.set_defaults(run=_worker)


def _worker(args) -> None:
    use_compile_cache(args.compile_cache)
    from sluice.cli.rank_group import rank_device, run_rank_group
    from sluice.worker.server import serve

    if args.tensor_parallel_size * args.pipeline_parallel_size > 1 and args.rank is None:
        sys.exit(run_rank_group(args, operations_flags))
    rank = args.rank or 0
    config = worker_config(args, model=args.model or str(default_model()), device=rank_device(args.device, rank),
                           rank=rank, dist_init_address=args.dist_init_address or "")
    _run_service(args, lambda operations: serve(config, args.listen, operations))


def _add_scheduler(commands) -> None:
    command = commands.add_parser("scheduler", help="run the scheduler (control plane)")
    command.add_argument("--listen", default="127.0.0.1:50052")
    command.add_argument("--worker", default="127.0.0.1:50053",
                         help="the worker's address; for a tensor- or pipeline-parallel replica, every rank's, "
                              "comma-separated in rank order")
    add_scheduler_options(command)
    add_operations_options(command)
    command.set_defaults(run=_scheduler)


def _scheduler(args) -> None:
    from sluice.scheduler.server import serve

    _run_service(args, lambda operations: serve(args.worker.split(","), args.listen, operations,
                                                **scheduler_options(args)))


def _add_router(commands) -> None:
    command = commands.add_parser("router", help="run the public router")
    command.add_argument("--listen", default=_DEFAULT_ROUTER_ADDRESS,
                         help="HOST:PORT; comma-separated to listen on several (e.g. a shared port and its own)")
    command.add_argument("--share-port", action="store_true",
                         help="let other router processes listen on the same port (SO_REUSEPORT): each takes a "
                              "share of its connections")
    command.add_argument("--scheduler", default="127.0.0.1:50052",
                         help="the scheduler's address; comma-separated to balance over several replicas")
    command.add_argument("--prefill-scheduler",
                         help="prefill replicas' schedulers (--kv-role prefill), comma-separated: each request "
                              "prefills on one of them and decodes on one of --scheduler's (--kv-role decode)")
    command.add_argument("--model", type=Path, help="where the tokenizer is (default: SmolLM2-135M)")
    command.add_argument("--no-tokenizer", action="store_true", help="token ids in and out (random-weight models)")
    add_router_options(command)
    add_operations_options(command)
    add_access_options(command)
    command.set_defaults(run=_router)


def _router(args) -> None:
    from sluice.router.server import serve

    tokenizer = None if args.no_tokenizer else args.model or default_model()
    interceptors, credentials = access_from(args, args.auth_token or os.environ.get("SLUICE_AUTH_TOKEN"))
    schedulers = args.scheduler.split(",")
    prefill = args.prefill_scheduler.split(",") if args.prefill_scheduler else []
    _run_service(args, lambda operations: serve(tokenizer, schedulers, args.listen.split(","), operations,
                                                interceptors, credentials, config=router_config(args),
                                                share_port=args.share_port, prefill_scheduler_addresses=prefill))


def _tracing_enabled() -> bool:
    """Tracing is on when an OTLP endpoint is configured (the exporter reads the other OTEL_* variables itself)."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return bool(endpoint) and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"


def _run_service(args, serve) -> None:
    """Runs serve(operations) until a signal: SIGTERM or SIGINT drains the service, a second one stops it at once."""
    async def run():
        operations = operations_from(args, _tracing_enabled())
        log.info("%s operations: %s", args.command, " ".join(as_flags(operations, Operations)))
        task = asyncio.current_task()

        def on_signal():
            if operations.shutdown.is_set():
                task.cancel()
            operations.shutdown.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            await serve(operations)
        except asyncio.CancelledError:
            pass

    asyncio.run(run())

