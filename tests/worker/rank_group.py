"""Runs a function on every rank of a real gloo process group, one spawned process per rank: the ranks of a
tensor-parallel group, or the stages of a pipeline of one rank each."""
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
    _spawn(function, (world_size, 1), args)


def run_on_stages(function, num_stages: int, *args) -> None:
    """Calls function(stage, *args) on each stage (its PipelineStage, layers not set); as run_on_ranks."""
    _spawn(function, (1, num_stages), args)


def _spawn(function, sizes: tuple[int, int], args) -> None:
    address = f"127.0.0.1:{free_port()}"
    torch.multiprocessing.spawn(_rank_main, args=(sizes, address, function, args), nprocs=sizes[0] * sizes[1])


def _rank_main(rank: int, sizes: tuple[int, int], address: str, function, args) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    groups = join_replica(rank, *sizes, address, torch.device("cpu"), timedelta(seconds=60))
    try:
        function(groups.tensor if groups.pipeline is None else groups.pipeline, *args)
        dist.barrier()  # the ranks leave together: none tears its connections down while another still uses them
    finally:
        dist.destroy_process_group()
    # A rank that passed ends here, before the interpreter finalizes, where gloo's teardown aborted rank 0 at random
    # ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
