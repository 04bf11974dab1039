"""Sampling in a replica of several ranks: the driver (tensor-parallel rank 0 of the last pipeline stage) samples
from the whole logits and shares the sampled tokens with the other ranks (one broadcast per step in its stage, one
send to each rank of the earlier stages), whose next step reads them as input ids without a round trip."""
import torch

from sluice.worker.parallel.group import TensorParallelGroup
from sluice.worker.parallel.pipeline import PipelineStage
from sluice.worker.sampling.speculative import Drafts
from sluice.worker.sampling.step import DeviceSample, SampleResult, StepSampler


class DriverSampler(StepSampler):
    def __init__(self, group: TensorParallelGroup | None, stage: PipelineStage | None, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = group
        self.stage = stage

    def sample(self, logits: torch.Tensor, request_ids: list[str], rows: torch.Tensor,
               spec_token_ids: dict[str, list[int]] | None = None, drafts: Drafts | None = None) -> DeviceSample:
        sample = super().sample(logits, request_ids, rows, spec_token_ids, drafts)
        if request_ids and self.group is not None:
            self.group.broadcast_from_driver(sample.token_ids)
        if request_ids and self.stage is not None:
            self.stage.send_sampled(sample.token_ids)
        return sample


class _NoRows:
    @staticmethod
    def indices(request_ids: list[str]) -> list[int]:
        return []


class _NoGrammars:
    active = False


class FollowerSampler:
    """StepSampler's interface on a rank that does not sample: its tokens are the driver's, broadcast in the last
    stage's group, or on their way to a rank of an earlier stage (`stage`), whose step has finished once they are
    in; it reports none (the driver does), so its step outcomes are completion markers."""

    rows = _NoRows()
    grammars = _NoGrammars()

    def __init__(self, group: TensorParallelGroup | None, stage: PipelineStage | None = None):
        self.group = group
        self.stage = stage

    def apply(self, plan) -> None:
        pass

    def sample(self, logits: torch.Tensor, request_ids: list[str], rows: torch.Tensor,
               spec_token_ids: dict[str, list[int]] | None = None, drafts: Drafts | None = None) -> DeviceSample:
        token_ids = torch.empty(len(request_ids), dtype=torch.int64, device=logits.device)
        sample = DeviceSample(request_ids, token_ids)
        if request_ids and self.stage is not None and not self.stage.is_last:
            sample.arriving = self.stage.receive_sampled(token_ids)
        elif request_ids:
            self.group.broadcast_from_driver(token_ids)
        return sample

    @staticmethod
    def finish(sample: DeviceSample, token_ids: list[int], num_accepted: list[int] = ()) -> SampleResult:
        return SampleResult({})

    @staticmethod
    def prompt_logprobs(logits: torch.Tensor, targets: list[int], num_top: int) -> None:
        return None
