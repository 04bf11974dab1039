"""One worker rank's tensor-parallel group: the process group of its pipeline stage's ranks and the collectives the
model and the runner use. The group is passed explicitly to whatever communicates; a worker of tensor-parallel size 1
has none."""
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import torch
import torch.distributed as dist

from sluice.worker.parallel.pipeline import PipelineStage

DRIVER_RANK = 0  # samples and answers the scheduler


@dataclass(slots=True)
class TensorParallelGroup:
    rank: int
    world_size: int
    device: torch.device
    process_group: dist.ProcessGroup

    @property
    def is_driver(self) -> bool:
        return self.rank == DRIVER_RANK

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums x over the ranks, in place."""
        dist.all_reduce(x, group=self.process_group)
        return x

    def gather_to_driver(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x (of one shape) concatenated along the last dimension, in rank order, on the driver; the
        other ranks get their own x back."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.is_driver else None
        dist.gather(x, parts, group=self.process_group, group_dst=DRIVER_RANK)
        return torch.cat(parts, dim=-1) if self.is_driver else x

    def broadcast_from_driver(self, x: torch.Tensor) -> torch.Tensor:
        """The driver's x, in place on every rank."""
        dist.broadcast(x, group=self.process_group, group_src=DRIVER_RANK)
        return x


class ReplicaGroups(NamedTuple):
    tensor: TensorParallelGroup | None  # the rank's stage's ranks (None at tensor-parallel size 1)
    pipeline: PipelineStage | None  # the rank's stage (None at pipeline-parallel size 1); its layers set at load


def join_replica(rank: int, tensor_parallel_size: int, pipeline_parallel_size: int, init_address: str,
                 device: torch.device, timeout: timedelta) -> ReplicaGroups:
    """Joins the tp x pp ranks that meet at init_address (HOST:PORT, where rank 0 listens): NCCL on CUDA, gloo on
    the CPU. A collective or a receive that waits longer than timeout fails instead of hanging."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://{init_address}", rank=rank,
                            world_size=tensor_parallel_size * pipeline_parallel_size, timeout=timeout, **options)
    tensor_rank, stage = rank % tensor_parallel_size, rank // tensor_parallel_size
    tensor = pipeline = None
    if pipeline_parallel_size > 1:
        pipeline = PipelineStage(stage, pipeline_parallel_size, range(0), tensor_rank, tensor_parallel_size)
    if tensor_parallel_size > 1:
        process_group = dist.group.WORLD
        if pipeline_parallel_size > 1:  # every rank creates every stage's group, in stage order
            groups = [dist.new_group(range(s * tensor_parallel_size, (s + 1) * tensor_parallel_size))
                      for s in range(pipeline_parallel_size)]
            process_group = groups[stage]
        tensor = TensorParallelGroup(tensor_rank, tensor_parallel_size, device, process_group)
    return ReplicaGroups(tensor, pipeline)


def replica_min(value: int, device: torch.device) -> int:
    """The smallest value over every rank of the replica."""
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())
