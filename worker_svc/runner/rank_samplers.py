"""Sampling in a tensor-parallel group: the driver samples from the whole logits and shares the sampled tokens with
the other ranks (one broadcast per step), whose next step reads them as input ids without a round trip."""
import torch

from sluice.worker.parallel.group import TensorParallelGroup
from sluice.worker.sampling.speculative import Drafts
from sluice.worker.sampling.step import DeviceSample, SampleResult, StepSampler


class DriverSampler(StepSampler):
    def __init__(self, group: TensorParallelGroup, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group

    def sample(self, logits: torch.Tensor, request_ids: list[str], rows: torch.Tensor,
               spec_token_ids: dict[str, list[int]] | None = None, drafts: Drafts | None = None) -> DeviceSample:
        sample = super().sample(logits, request_ids, rows, spec_token_ids, drafts)
        if request_ids:
            self.group.broadcast_from_driver(sample.token_ids)
        return sample


class _NoRows:
    @staticmethod
    def indices(request_ids: list[str]) -> list[int]:
        return []


class _NoGrammars:
    active = False


class FollowerSampler:
    """StepSampler's interface on a rank that does not sample: its tokens are the driver's; it reports none (the
    driver does), so its step outcomes are completion markers."""

    rows = _NoRows()
    grammars = _NoGrammars()

    def __init__(self, group: TensorParallelGroup):
        self.group = group

    def apply(self, plan) -> None:
        pass

    def sample(self, logits: torch.Tensor, request_ids: list[str], rows: torch.Tensor,
               spec_token_ids: dict[str, list[int]] | None = None, drafts: Drafts | None = None) -> DeviceSample:
        token_ids = torch.empty(len(request_ids), dtype=torch.int64, device=logits.device)
        if request_ids:
            self.group.broadcast_from_driver(token_ids)
        return DeviceSample(request_ids, token_ids)

    @staticmethod
    def finish(sample: DeviceSample, token_ids: list[int], num_accepted: list[int] = ()) -> SampleResult:
        return SampleResult({})

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: list[int], num_top: int) -> None:
        return None
