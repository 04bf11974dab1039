"""One worker rank's pipeline stage: which of the model's layers it runs, and the point-to-point traffic between the
stages of its replica. Rank r is tensor-parallel rank r % tp of stage r // tp; each rank exchanges activations with
the rank of its tensor-parallel index in the stages beside it. The last stage samples: its tensor-parallel rank 0
sends every step's sampled tokens to each rank of the stages before it, whose next steps read them as input ids."""
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_ACTIVATIONS, _SAMPLED = 1, 2  # message tags


def layer_partition(num_layers: int, num_stages: int, partition: str = "") -> list[range]:
    """Each stage's layers: as `partition` counts them (comma-separated, in stage order), else as even as they
    divide, the earlier stages taking one more where they do not."""
    if partition:
        counts = [int(count) for count in partition.split(",")]
        if len(counts) != num_stages or sum(counts) != num_layers or min(counts) < 1:
            raise ValueError(f"pp_layer_partition {partition!r} must give each of the {num_stages} stages at least "
                             f"one layer, {num_layers} in all")
    else:
        if num_stages > num_layers:
            raise ValueError(f"pipeline_parallel_size {num_stages} exceeds the model's {num_layers} layers")
        counts = [num_layers // num_stages + (stage < num_layers % num_stages) for stage in range(num_stages)]
    starts = [sum(counts[:stage]) for stage in range(num_stages)]
    return [range(start, start + count) for start, count in zip(starts, counts)]


@dataclass(slots=True)
class PipelineStage:
    index: int  # the stage's place in the pipeline, 0 first
    num_stages: int
    layers: range  # the model's layers this stage runs
    tensor_parallel_rank: int
    tensor_parallel_size: int
    # on the CPU, waits for the tokens on their way from the last stage (gloo's receives say when they are done only
    # by blocking), so that a step's outcome is collected once they are in, while the next steps launch
    _receiver: ThreadPoolExecutor = field(init=False, repr=False,
                                          default_factory=lambda: ThreadPoolExecutor(1, "sluice-sampled-tokens"))

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1

    @property
    def sampling_rank(self) -> int:
        """The rank that samples: tensor-parallel rank 0 of the last stage."""
        return (self.num_stages - 1) * self.tensor_parallel_size

    def holds(self, name: str) -> bool:
        """Whether a weight (a checkpoint's name, or the worker's) is this stage's: its layers', the embedding on the
        first stage, the final norm and the LM head on the last (which reads a tied LM head from the embedding)."""
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            return int(name.split(".", 2)[1]) in self.layers
        if name.startswith("embed_tokens."):
            return self.is_first or self.is_last
        return self.is_last

    def send_activations(self, activations: torch.Tensor) -> None:
        """The stage's output, [num_tokens, 2, hidden] (each token's hidden states and residual stream), to the next
        stage."""
        dist.send(activations.contiguous(), self._rank_of(self.index + 1), tag=_ACTIVATIONS)

    def receive_activations(self, activations: torch.Tensor) -> None:
        """Fills activations, [num_tokens, 2, hidden], with the previous stage's output."""
        dist.recv(activations, self._rank_of(self.index - 1), tag=_ACTIVATIONS)

    def send_sampled(self, token_ids: torch.Tensor) -> None:
        """The step's sampled tokens, from the sampling rank to every rank of the earlier stages."""
        token_ids = token_ids.contiguous()
        for rank in range(self.sampling_rank):
            dist.send(token_ids, rank, tag=_SAMPLED)

    def receive_sampled(self, token_ids: torch.Tensor) -> Future | None:
        """Fills token_ids with a step's sampled tokens (steps in launch order): on the CPU, done once they are in;
        on CUDA (None), the device stream waits for them, so whatever reads them later is queued after them."""
        work = dist.irecv(token_ids, self.sampling_rank, tag=_SAMPLED)
        if token_ids.is_cuda:
            work.wait()
            return None
        return self._receiver.submit(work.wait)

    def _rank_of(self, stage: int) -> int:
        return stage * self.tensor_parallel_size + self.tensor_parallel_rank
