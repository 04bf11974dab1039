"""The services' command-line options, derived from their config dataclasses' option() fields: shared by `sluice serve`,
the services and `sluice bench`, and passed on by `sluice serve` to the services it starts."""
import argparse

from sluice.core.options import add_options, as_flags, option_values
from sluice.router.config import RouterConfig
from sluice.scheduler.config import SchedulerConfig
from sluice.worker.config import WorkerConfig

SHARED_OPTIONS = ("kv_role",)  # one flag of the scheduler's, which sets the workers' too where one command starts both


def add_worker_options(parser, with_scheduler: bool = False) -> None:
    """with_scheduler: the command also takes the scheduler's options, which set the shared ones."""
    add_options(parser, WorkerConfig, skip=SHARED_OPTIONS if with_scheduler else ())


def add_scheduler_options(parser) -> None:
    add_options(parser, SchedulerConfig)


def add_router_options(parser) -> None:
    add_options(parser, RouterConfig)


def worker_config(args, **placed) -> WorkerConfig:
    """The worker's settings from its flags; placed: the fields the command sets itself (the rank, the device)."""
    return WorkerConfig(**{**option_values(args, WorkerConfig), **placed})


def scheduler_options(args) -> dict:
    return option_values(args, SchedulerConfig)


def router_config(args) -> RouterConfig:
    return RouterConfig(**option_values(args, RouterConfig))


def worker_flags(args, **placed) -> list[str]:
    return as_flags({**option_values(args, WorkerConfig), **placed}, WorkerConfig)


def scheduler_flags(args) -> list[str]:
    return as_flags(args, SchedulerConfig)


def router_flags(args) -> list[str]:
    return as_flags(args, RouterConfig)


def add_router_process_options(parser) -> None:
    parser.add_argument("--router-processes", type=_at_least_one, default=1,
                        help="router processes sharing the router's port (SO_REUSEPORT), each taking a share of "
                             "its client connections: one router's event loop carries about 25,000 streamed "
                             "tokens a second")


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
