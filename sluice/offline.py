"""The engine without gRPC: the real Scheduler and WorkerEngine stepped in one process.

Used by `sluice bench --in-process` and by GPU checks, so the cost of the service split is always measurable.
"""
from dataclasses import dataclass, field, replace

from scheduler_svc.config import SchedulerConfig
from scheduler_svc.request import Request
from scheduler_svc.scheduler import Scheduler
from sluice.sampling_params import SamplingParams
from worker_svc.engine import WorkerEngine


@dataclass(slots=True)
class OfflineResult:
    request_id: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class OfflineEngine:
    def __init__(self, worker: WorkerEngine, block_size: int = 16, num_blocks: int = 0, **scheduler_options):
        max_model_len = min(scheduler_options.pop("max_model_len", 8192),
                            worker.model_config.max_position_embeddings)
        config = SchedulerConfig(num_blocks=max(num_blocks, 1), block_size=block_size, max_model_len=max_model_len,
                                 **scheduler_options)
        num_blocks = worker.init_cache(block_size, num_blocks, config.max_num_batched_tokens, config.max_num_seqs,
                                       config.max_model_len)
        self.scheduler = Scheduler(replace(config, num_blocks=num_blocks), set(worker.model_config.eos_token_ids))
        self.worker = worker
        self.num_steps = 0

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[OfflineResult]:
        results = {}
        for i, (prompt, sampling) in enumerate(zip(prompts, params)):
            self.scheduler.add_request(Request(f"offline-{i}", list(prompt), sampling))
            results[f"offline-{i}"] = OfflineResult(f"offline-{i}")
        while self.scheduler.has_unfinished_requests():
            plan = self.scheduler.schedule()
            for update in self.scheduler.update_from_outcome(plan, self.worker.execute(plan)):
                result = results[update.request_id]
                result.token_ids.extend(update.new_token_ids)
                if update.finished:
                    result.finish_reason = update.finish_reason.value
            self.num_steps += 1
        return list(results.values())

