"""On a GPU a launched step's logprobs are already on their way to the host: finish() reads host tensors, so it
never waits for the steps that async scheduling queued after it."""
import pytest
import torch

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the asynchronous copy needs a CUDA device")


class LaunchRecorder:
    """The worker, with every launched step kept for inspection."""

    def __init__(self, worker: WorkerEngine):
        self.worker = worker
        self.steps = []

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def launch(self, plan):
        step = self.worker.launch(plan)
        self.steps.append(step)
        return step


def test_launched_steps_hold_host_copies_of_their_logprobs():
    worker = WorkerEngine.load(WorkerConfig(model="Qwen3-0.6B", load_format="dummy", dtype="float32", device="cuda",
                                            gpu_memory_utilization=0.3))
    engine = OfflineEngine(worker, max_model_len=1024, max_num_seqs=8)
    recorder = engine.worker = LaunchRecorder(worker)
    params = [SamplingParams(max_tokens=12, temperature=0.7, seed=i, logprobs=3, prompt_logprobs=2 if i == 0 else None,
                             ignore_eos=True) for i in range(4)]
    results = engine.generate([[1 + i, 2, 3, 4, 5] for i in range(4)], params)
    assert [len(result.token_ids) for result in results] == [12] * 4
    with_logprobs = [step for step in recorder.steps if step.sample is not None and step.sample.logprobs is not None]
    assert len(with_logprobs) >= 12
    for step in with_logprobs:
        assert step.sample.logprobs.logprobs.device.type == "cpu"
        assert step.sample.logprobs.top_ids.device.type == "cpu"
        assert (step.sample.logprobs.logprobs <= 0).all()
        assert (step.sample.logprobs.top_logprobs[:, 0] >= step.sample.logprobs.logprobs).all()
    prompt_steps = [step for step in recorder.steps if step.prompt_logprobs is not None]
    assert prompt_steps and all(step.prompt_logprobs.logprobs.device.type == "cpu" for step in prompt_steps)
