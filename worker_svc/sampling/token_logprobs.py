"""Log probabilities of given tokens under raw logits, with their ranks and the most likely alternatives: reduced on
the device when the step launches (the logits are not kept, nor copied), listed on the host when it finishes."""
from dataclasses import dataclass

import torch

from sluice.core.logprobs import LogprobRows
from sluice.worker.sampling import kernel_path


@dataclass(slots=True)
class LogprobTensors:
    """Rows in order; each group (request id, number of rows, num_top) owns the next rows."""

    groups: list[tuple[str, int, int]]
    token_ids: torch.Tensor  # [rows] int64
    logprobs: torch.Tensor  # [rows] float32
    ranks: torch.Tensor  # [rows] int64
    top_ids: torch.Tensor  # [rows, the groups' largest num_top] int64
    top_logprobs: torch.Tensor  # [rows, the groups' largest num_top] float32

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.token_ids, self.logprobs, self.ranks, self.top_ids, self.top_logprobs

    def on_host(self) -> "LogprobTensors":
        """A copy on the host, queued without waiting for the device: complete once the device has passed this
        point of its stream."""
        return LogprobTensors(self.groups, *(tensor.to("cpu", non_blocking=True) for tensor in self.tensors))

    def rows(self) -> LogprobRows:
        """As packed lists, each row with its group's num_top alternatives."""
        request_ids, num_rows, num_tops = (list(column) for column in zip(*self.groups))
        top_ids, top_logprobs = self.top_ids, self.top_logprobs
        if min(num_tops) < top_ids.shape[1]:
            device = top_ids.device
            row_tops = torch.tensor(num_tops, device=device).repeat_interleave(torch.tensor(num_rows, device=device))
            kept = torch.arange(top_ids.shape[1], device=device) < row_tops.unsqueeze(1)
            top_ids, top_logprobs = top_ids[kept], top_logprobs[kept]
        return LogprobRows(request_ids, num_rows, num_tops, self.token_ids.tolist(), self.logprobs.tolist(),
                           self.ranks.tolist(), top_ids.flatten().tolist(), top_logprobs.flatten().tolist())


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, groups: list[tuple[str, int, int]],
                   num_top: int) -> LogprobTensors:
    """logits: [rows, vocab] raw; token_ids: [rows]; num_top: the largest of the rows' groups. Reductions over the
    logits as they are (a logprob is the logit less the row's logsumexp): no second [rows, vocab] tensor is made. On
    a GPU one kernel (kernels.logprob_stats) reads the logits once for all of them."""
    chosen = logits.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    if kernel_path.runs_kernels(logits):
        from sluice.kernels.logprob_stats import logprob_stats  # every CUDA build of torch brings Triton
        normaliser, ranks, top_logits, top_ids = logprob_stats(logits, token_ids, num_top)
    else:
        normaliser = logits.logsumexp(dim=-1)
        ranks = (logits > chosen.unsqueeze(1)).sum(dim=1) + 1
        top_logits, top_ids = logits.topk(num_top, dim=-1)
    return LogprobTensors(groups, token_ids, chosen - normaliser, ranks, top_ids, top_logits - normaliser.unsqueeze(1))


def joined(parts: list[LogprobTensors], groups: list[tuple[str, int, int]]) -> LogprobTensors:
    """Consecutive rows' parts as one, in `groups`."""
    return LogprobTensors(groups, *(torch.cat(columns) for columns in zip(*(part.tensors for part in parts))))
