import torch

from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import CachedRequest, NewRequest, StepPlan
from sluice.worker.engine import WorkerEngine
from sluice.worker.ops.attention_metadata import AttentionMetadata
from sluice.worker.runner.kv_cache import allocate_kv_cache

BLOCK_SIZE = 16


def run_greedy(engine: WorkerEngine, prompts: list[list[int]], max_new_tokens: int, chunk: int,
               max_model_len: int = 8192) -> list[list[int]]:
    """Prefills every prompt in chunks of `chunk` tokens, all requests in one batch, then decodes together. The plans
    do not depend on the sampled tokens, so every rank of a tensor-parallel group can run them (only the driver's
    outcomes carry tokens; the others' lists stay empty)."""
    engine.init_cache(BLOCK_SIZE, 64 * len(prompts), max_model_len=max_model_len)
    requests = {f"r{i}": list(p) for i, p in enumerate(prompts)}
    blocks = {rid: list(range(i * 64, (i + 1) * 64)) for i, rid in enumerate(requests)}
    num_tokens = {rid: len(tokens) for rid, tokens in requests.items()}
    computed = dict.fromkeys(requests, 0)
    outputs = {rid: [] for rid in requests}
    num_steps = max(-(-len(p) // chunk) for p in prompts) + max_new_tokens - 1
    for step in range(num_steps):
        scheduled = {rid: min(chunk, num_tokens[rid] - computed[rid]) for rid in requests}
        new = [NewRequest(rid, tokens, blocks[rid], 0, SamplingParams(temperature=0.0))
               for rid, tokens in requests.items() if step == 0]
        cached = [] if step == 0 else [CachedRequest(rid, [], computed[rid], len(blocks[rid])) for rid in requests]
        outcome = engine.execute(StepPlan(step, new, cached, scheduled))
        for rid, n in scheduled.items():
            computed[rid] += n
            num_tokens[rid] += computed[rid] == num_tokens[rid]  # it sampled a token
        for rid, token in outcome.sampled_token_ids.items():
            outputs[rid].append(token)
    return [outputs[f"r{i}"][:max_new_tokens] for i in range(len(prompts))]


def prompt_logits(engine: WorkerEngine, token_ids: list[int]) -> torch.Tensor:
    """float32 [len(token_ids), vocab]: the model's logits at every position of one prompt, in one prefill."""
    n = len(token_ids)
    num_blocks = -(-n // BLOCK_SIZE)
    kv_caches = allocate_kv_cache(engine.local_config, num_blocks, BLOCK_SIZE, engine.kv_cache_dtype,
                                  engine.device)
    device = engine.device
    cos_sin_cache = engine.model.cos_sin_cache(n).to(device)
    positions = torch.arange(n, device=device)
    meta = AttentionMetadata(slot_mapping=positions, query_start_loc=torch.tensor([0, n], dtype=torch.int32,
                                                                                  device=device),
                             seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
                             block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
                             token_seq_index=torch.zeros(n, dtype=torch.int64, device=device),
                             token_query_pos=positions, max_query_len=n, max_seq_len=n)
    with torch.inference_mode():
        return engine.model(torch.tensor(token_ids, device=device), positions, cos_sin_cache, kv_caches, meta, None)
