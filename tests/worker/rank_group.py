"""Runs a function on every rank of a real gloo process group, one spawned process per rank."""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing

from sluice.cli.launcher import free_port
from sluice.worker.parallel.group import join_replica


def run_on_ranks(function, world_size: int, *args) -> None:
    """Calls function(group, *args) on each rank; a rank's exception fails the call. function: module-level."""
    address = f"127.0.0.1:{free_port()}"
    torch.multiprocessing.spawn(_rank_main, args=(world_size, address, function, args), nprocs=world_size)


def _rank_main(rank: int, world_size: int, address: str, function, args) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    group = join_replica(rank, world_size, 1, address, torch.device("cpu"), timedelta(seconds=60)).tensor
    try:
        function(group, *args)
        dist.barrier()  # the ranks leave together: none tears its connections down while another still uses them
    finally:
        dist.destroy_process_group()
    # A rank that passed ends here, before the interpreter finalizes, where gloo's teardown aborted rank 0 at random
    # ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
