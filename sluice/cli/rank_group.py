"""`sluice worker -tp N -pp P` without --rank: the N x P ranks of one model replica (N tensor-parallel ranks in each
of P pipeline stages), or with --pp-rank one stage's N, as worker processes on this machine that live and die
together. When one exits, the others are stopped (their process group is broken) and this process exits, so
whatever restarts it (`sluice serve`, a Kubernetes container) starts the group again; the other stages' ranks fail
their next transfer with it, and their hosts start theirs again likewise."""
import logging
import signal
import subprocess
import sys
import time

from sluice.cli.launcher import free_port, stop_services
from sluice.cli.python_command import sluice_command
from sluice.cli.service_flags import worker_flags

log = logging.getLogger("sluice.worker")
_POLL_SECONDS = 0.2
_STOP_GRACE_SECONDS = 5.0  # beyond the ranks' drain timeout


def rank_device(device: str, rank: int) -> str:
    """`cuda` runs rank r on cuda:r; any other device as given."""
    return f"cuda:{rank}" if device == "cuda" else device


def _group_device(device: str, rank: int) -> str:
    """In a group on this machine, `cuda:K` runs its rank r (counted on this machine) on cuda:K+r."""
    if device.startswith("cuda:"):
        return f"cuda:{int(device.removeprefix('cuda:')) + rank}"
    return rank_device(device, rank)


def rank_addresses(listen: str, world_size: int) -> list[str]:
    addresses = listen.split(",")
    if len(addresses) == world_size:
        return addresses
    if len(addresses) != 1:
        raise SystemExit(f"--listen names {len(addresses)} addresses for {world_size} ranks")
    host, port = listen.rsplit(":", 1)
    return [f"{host}:{int(port) + rank}" for rank in range(world_size)]


def group_ranks(args) -> range:
    """The ranks this machine runs: every rank of the replica, or with --pp-rank K the tensor-parallel ranks of
    stage K (the other stages run elsewhere, meeting at --dist-init-address)."""
    if args.pp_rank is None:
        return range(args.tensor_parallel_size * args.pipeline_parallel_size)
    if not 0 <= args.pp_rank < args.pipeline_parallel_size:
        raise SystemExit(f"--pp-rank must be in [0, {args.pipeline_parallel_size}), got {args.pp_rank}")
    if not args.dist_init_address:
        raise SystemExit("--pp-rank needs --dist-init-address, where the first stage's rank 0 meets every stage")
    return range(args.pp_rank * args.tensor_parallel_size, (args.pp_rank + 1) * args.tensor_parallel_size)


def run_rank_group(args, operations_flags) -> int:
    """Returns the exit code for this process: 0 after a signal stopped the ranks, else non-zero."""
    from sluice.cli.model_store import default_model

    args.model = args.model or default_model()
    ranks = group_ranks(args)
    init_address = args.dist_init_address or f"127.0.0.1:{free_port()}"
    processes = [
        subprocess.Popen([*sluice_command("--log-level", str(args.log_level), "worker"),
                          "--listen", address, "--rank", str(rank), "--dist-init-address", init_address,
                          *worker_flags(args, device=_group_device(args.device, local_rank)),
                          *operations_flags(args, metrics_port_offset=local_rank)])
        for local_rank, (rank, address) in enumerate(zip(ranks, rank_addresses(args.listen, len(ranks))))
    ]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            for rank, process in enumerate(processes):
                if process.poll() is not None:
                    log.error("rank %d exited with code %d: stopping the other ranks", rank, process.returncode)
                    _kill(processes)  # their group is broken: nothing they hold can finish
                    return process.returncode or 1
            time.sleep(_POLL_SECONDS)
    except KeyboardInterrupt:
        return 0
    finally:  # after a signal: the ranks drain
        stop_services(processes, timeout=args.drain_timeout + _STOP_GRACE_SECONDS)


def _kill(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
