"""One worker rank's tensor-parallel group: the process group it was started in and the collectives the model and
the runner use. The group is passed explicitly to whatever communicates; a worker of world size 1 has none."""
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

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
        dist.gather(x, parts, dst=DRIVER_RANK, group=self.process_group)
        return torch.cat(parts, dim=-1) if self.is_driver else x

    def broadcast_from_driver(self, x: torch.Tensor) -> torch.Tensor:
        """The driver's x, in place on every rank."""
        dist.broadcast(x, src=DRIVER_RANK, group=self.process_group)
        return x

    def min(self, value: int) -> int:
        """The smallest value over the ranks."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.process_group)
        return int(t.item())


def join_group(rank: int, world_size: int, init_address: str, device: torch.device,
               timeout: timedelta) -> TensorParallelGroup:
    """Joins the ranks that meet at init_address (HOST:PORT, where rank 0 listens): NCCL on CUDA, gloo on the CPU.
    A collective that waits longer than timeout fails instead of hanging."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://{init_address}", rank=rank, world_size=world_size,
                            timeout=timeout, **options)
    return TensorParallelGroup(rank, world_size, device, dist.group.WORLD)
