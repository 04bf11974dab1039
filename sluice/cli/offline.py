"""The engine without gRPC: the real Scheduler and WorkerEngine stepped in one process.

Used by `sluice bench --in-process` and by GPU checks, so the cost of the service split is always measurable.
"""
from dataclasses import dataclass, field, replace

from sluice.core.sampling_params import SamplingParams
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT, Scheduler
from sluice.scheduler.steps_in_flight import StepsInFlight
from sluice.worker.engine import WorkerEngine
from sluice.worker.runner.model_runner import LaunchedStep


@dataclass(slots=True)
class OfflineResult:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class OfflineEngine:
    def __init__(self, worker: WorkerEngine, block_size: int = 16, num_blocks: int = 0,
                 steps_in_flight: int | None = None, **scheduler_options):
        """steps_in_flight: how many steps are launched before the oldest one's outcome is applied. On a GPU the
        default is the scheduler's limit, so the device never waits for the host's bookkeeping; on the CPU it is 1
        (a step computes as it is launched there, so there is nothing to overlap)."""
        max_model_len = min(scheduler_options.pop("max_model_len", 8192), worker.max_model_len)
        config = SchedulerConfig(num_blocks=num_blocks, block_size=block_size, max_model_len=max_model_len,
                                 **scheduler_options)
        num_blocks = worker.init_cache(block_size, num_blocks, config.max_num_batched_tokens, config.max_num_seqs,
                                       config.max_model_len)
        self.scheduler = Scheduler(replace(config, num_blocks=num_blocks), set(worker.model_config.eos_token_ids),
                                   attention_window=worker.attention_window)
        self.worker = worker
        self.steps_in_flight = steps_in_flight or (MAX_STEPS_IN_FLIGHT if worker.device.type == "cuda" else 1)
        self.num_steps = 0

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[OfflineResult]:
        results = {}
        for i, (prompt, sampling) in enumerate(zip(prompts, params)):
            self.scheduler.add_request(Request(f"offline-{i}", list(prompt), sampling))
            results[f"offline-{i}"] = OfflineResult(f"offline-{i}")
        steps: StepsInFlight[LaunchedStep] = StepsInFlight(self.scheduler, self.worker.launch)
        while self.scheduler.has_unfinished_requests() or steps:
            while self.scheduler.has_unfinished_requests() and steps.send_next(self.steps_in_flight):
                pass
            for update in steps.apply_oldest(self.worker.finish(steps.oldest.sent)):
                result = results[update.request_id]
                result.token_ids.extend(update.new_token_ids)
                if update.finished:
                    result.finish_reason = update.finish_reason.value
            self.num_steps += 1
        return list(results.values())

