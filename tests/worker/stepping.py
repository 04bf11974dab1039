from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import CachedRequest, NewRequest, StepPlan
from worker_svc.engine import WorkerEngine

BLOCK_SIZE = 16


def run_greedy(engine: WorkerEngine, prompts: list[list[int]], max_new_tokens: int, chunk: int) -> list[list[int]]:
    """Prefills every prompt in chunks of `chunk` tokens, all requests in one batch, then decodes together. The plans
    do not depend on the sampled tokens, so every rank of a tensor-parallel group can run them (only the driver's
    outcomes carry tokens; the others' lists stay empty)."""
    engine.init_cache(BLOCK_SIZE, 64 * len(prompts))
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
