"""The worker engine in process, stepped by hand with chunked prefill, against Hugging Face transformers."""
import pytest
import torch

from scheduler_svc.step_plan import CachedRequest, NewRequest, StepPlan
from sluice.model_store import default_gguf_path
from sluice.sampling_params import SamplingParams
from tests.e2e.hf_reference import hf_greedy
from worker_svc.config import WorkerConfig
from worker_svc.engine import WorkerEngine

BLOCK_SIZE = 16


def _run_greedy(engine: WorkerEngine, prompts: list[list[int]], max_new_tokens: int, chunk: int) -> list[list[int]]:
    """Prefills every prompt in chunks of `chunk` tokens, all requests in one batch, then decodes together."""
    engine.init_cache(BLOCK_SIZE, 64 * len(prompts))
    requests = {f"r{i}": list(p) for i, p in enumerate(prompts)}
    blocks = {rid: list(range(i * 64, (i + 1) * 64)) for i, rid in enumerate(requests)}
    computed = dict.fromkeys(requests, 0)
    outputs = {rid: [] for rid in requests}
    step = 0
    while any(len(out) < max_new_tokens for out in outputs.values()):
        scheduled = {rid: min(chunk, len(tokens) - computed[rid]) for rid, tokens in requests.items()}
        new = [NewRequest(rid, tokens, blocks[rid], 0, SamplingParams(temperature=0.0))
               for rid, tokens in requests.items() if step == 0]
        cached = [] if step == 0 else [CachedRequest(rid, [], computed[rid]) for rid in requests]
        outcome = engine.execute(StepPlan(step, new, cached, scheduled))
        for rid, n in scheduled.items():
            computed[rid] += n
        for rid, token in outcome.sampled_token_ids.items():
            outputs[rid].append(token)
            requests[rid].append(token)
        step += 1
    return [outputs[f"r{i}"] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def prompts(hf_tokenizer):
    texts = ["The capital of France is", "def quicksort(xs):", "A long time ago in a galaxy far, far away, there"]
    return [hf_tokenizer(t).input_ids for t in texts]


@pytest.mark.parametrize("chunk", [1000, 5])
def test_batched_chunked_prefill_matches_hf(default_model_dir, hf_model, prompts, chunk):
    engine = WorkerEngine(WorkerConfig(model=str(default_model_dir)))
    expected = [hf_greedy(hf_model, p, 24) for p in prompts]
    got = _run_greedy(engine, prompts, 24, chunk)
    assert [g[:len(e)] for g, e in zip(got, expected)] == expected


def test_gguf_file_loads_the_same_weights(default_model_dir):
    from_folder = WorkerEngine(WorkerConfig(model=str(default_model_dir)))
    from_gguf = WorkerEngine(WorkerConfig(model=str(default_gguf_path(default_model_dir.parents[1]))))
    for (name, a), b in zip(from_folder.model.state_dict().items(), from_gguf.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_bfloat16_stays_close_to_float32(default_model_dir, prompts):
    bf16 = WorkerEngine(WorkerConfig(model=str(default_model_dir), dtype="bfloat16"))
    fp32 = WorkerEngine(WorkerConfig(model=str(default_model_dir)))
    got_bf16 = _run_greedy(bf16, prompts, 8, 1000)
    got_fp32 = _run_greedy(fp32, prompts, 8, 1000)
    agreeing = sum(a == b for x, y in zip(got_bf16, got_fp32) for a, b in zip(x[:4], y[:4]))
    assert agreeing >= 10
