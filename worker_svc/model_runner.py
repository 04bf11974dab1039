import torch

from scheduler_svc.step_plan import StepOutcome, StepPlan
from worker_svc.attention_metadata import AttentionMetadata
from worker_svc.batch_state import BatchState
from worker_svc.decode_graphs import DecodeGraphs
from worker_svc.kv_cache import copy_blocks
from worker_svc.logits_rows import logits_rows
from worker_svc.step_inputs import StepInputBuilder
from worker_svc.step_sampler import StepSampler


class ModelRunner:
    """Turns a StepPlan into tensors, runs the model over every scheduled token at once, and samples."""

    def __init__(self, model, kv_caches, cos_sin_cache: torch.Tensor, block_size: int, device: torch.device,
                 decode_graphs: DecodeGraphs | None, sampler: StepSampler):
        self.model = model
        self.decode_graphs = decode_graphs
        self.kv_caches = kv_caches
        self.cos_sin_cache = cos_sin_cache
        self.device = device
        self.batch = BatchState()
        self.inputs = StepInputBuilder(block_size, device)
        self.sampler = sampler

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutcome:
        self.batch.apply(plan)
        self.sampler.apply(plan)
        if plan.block_copies:
            copy_blocks(self.kv_caches, plan.block_copies)
        if not plan.num_scheduled_tokens:
            return StepOutcome(plan.step_id, {})
        request_ids = list(plan.num_scheduled_tokens)
        states = [self.batch.requests[request_id] for request_id in request_ids]
        query_lens = [plan.num_scheduled_tokens[request_id] for request_id in request_ids]
        inputs = self.inputs.build(self.batch, states, query_lens)
        rows = logits_rows(request_ids, states, query_lens)
        logits = self._forward(inputs.input_ids, inputs.positions, inputs.meta, rows.token_indices)
        num_samples = len(rows.sample_request_ids)
        result = self.sampler.sample(logits[:num_samples], rows.sample_request_ids)
        prompt_logprobs = self.sampler.prompt_logprobs(logits[num_samples:], rows.prompt_targets, rows.prompt_groups)
        self.batch.record_step(plan, result.sampled_token_ids)
        return StepOutcome(plan.step_id, result.sampled_token_ids, result.logprobs, prompt_logprobs,
                           result.grammar_completed_request_ids)

    def _forward(self, input_ids, positions, meta: AttentionMetadata, token_indices: list[int]) -> torch.Tensor:
        graphs = self.decode_graphs
        if graphs is not None and meta.is_pure_decode and graphs.fits(meta.num_seqs):
            logits = graphs.run(input_ids, positions, meta.slot_mapping, meta.seq_lens, meta.block_tables)
            return logits if token_indices == list(range(meta.num_seqs)) else logits[token_indices]
        logits_indices = torch.tensor(token_indices, dtype=torch.int64, device=self.device)
        return self.model(input_ids, positions, self.cos_sin_cache, self.kv_caches, meta, logits_indices)
