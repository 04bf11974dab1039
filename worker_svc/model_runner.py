import torch

from scheduler_svc.step_plan import StepOutcome, StepPlan
from worker_svc.attention_metadata import AttentionMetadata
from worker_svc.batch_state import BatchState
from worker_svc.sampler import SamplingTensors, sample


class ModelRunner:
    """Turns a StepPlan into tensors, runs the model over every scheduled token at once, and samples."""

    def __init__(self, model, kv_caches, cos_sin_cache: torch.Tensor, block_size: int, device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.cos_sin_cache = cos_sin_cache
        self.block_size = block_size
        self.device = device
        self.batch = BatchState()
        self.generator = torch.Generator(device=device)

    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutcome:
        self.batch.apply(plan)
        if not plan.num_scheduled_tokens:
            return StepOutcome(plan.step_id, {})
        request_ids = list(plan.num_scheduled_tokens)
        states = [self.batch.requests[request_id] for request_id in request_ids]
        query_lens = [plan.num_scheduled_tokens[request_id] for request_id in request_ids]
        input_ids, meta, positions = self._prepare_inputs(states, query_lens)
        # a request samples when this step reaches its last known token (not mid-way through a prompt chunk)
        samples = [i for i, (s, n) in enumerate(zip(states, query_lens)) if s.num_computed_tokens + n == len(s.token_ids)]
        logits_indices = (meta.query_start_loc[1:] - 1)[samples].long()
        logits = self.model(input_ids, positions, self.cos_sin_cache, self.kv_caches, meta, logits_indices)
        vocab_size = logits.shape[-1]
        tensors = SamplingTensors.build([states[i].sampling_params for i in samples], vocab_size, self.device)
        sampled_ids = sample(logits, tensors, self.generator).tolist()
        sampled = {request_ids[i]: token for i, token in zip(samples, sampled_ids)}
        self.batch.record_step(plan, sampled)
        return StepOutcome(plan.step_id, sampled)

    def _prepare_inputs(self, states, query_lens: list[int]):
        starts = [s.num_computed_tokens for s in states]
        input_ids = [t for s, start, n in zip(states, starts, query_lens) for t in s.token_ids[start:start + n]]
        max_blocks = max(len(s.block_ids) for s in states)
        tables = [s.block_ids + [0] * (max_blocks - len(s.block_ids)) for s in states]

        device = self.device
        query_lens_t = torch.tensor(query_lens, dtype=torch.int64)
        starts_t = torch.tensor(starts, dtype=torch.int64)
        query_start_loc = torch.zeros(len(states) + 1, dtype=torch.int64)
        torch.cumsum(query_lens_t, 0, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        token_seq_index = torch.repeat_interleave(torch.arange(len(states)), query_lens_t)
        token_query_pos = torch.arange(num_tokens) - query_start_loc[:-1][token_seq_index]
        positions = starts_t[token_seq_index] + token_query_pos
        block_tables = torch.tensor(tables, dtype=torch.int32)
        block_of_token = block_tables[token_seq_index, positions // self.block_size].long()
        slot_mapping = block_of_token * self.block_size + positions % self.block_size
        seq_lens = starts_t + query_lens_t
        meta = AttentionMetadata(
            slot_mapping=slot_mapping.to(device),
            query_start_loc=query_start_loc.to(device=device, dtype=torch.int32),
            seq_lens=seq_lens.to(device=device, dtype=torch.int32),
            block_tables=block_tables.to(device),
            token_seq_index=token_seq_index.to(device),
            token_query_pos=token_query_pos.to(device),
            max_query_len=max(query_lens),
            max_seq_len=int(seq_lens.max()),
        )
        return torch.tensor(input_ids, dtype=torch.int64, device=device), meta, positions.to(device)
