"""CUDA graphs against the eager pass on one GPU: the same random weights, greedy, float32. The batch shrinks as
requests finish, so the decode graphs replay at every ladder size up to 8, with padding rows and without; a small
token budget splits prompts into chunks that share piecewise-graph steps with the other requests' decodes. A draft
model (the target's own weights: every proposal right) runs its catch-up and proposal passes through its own graphs."""
import pytest
import torch

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def _greedy_tokens(enforce_eager: bool, draft_model: str = "", **scheduler_options) -> list[list[int]]:
    worker = WorkerEngine.load(WorkerConfig(model="Qwen3-0.6B", load_format="dummy", dtype="float32", device="cuda",
                                            enforce_eager=enforce_eager, gpu_memory_utilization=0.3,
                                            draft_model=draft_model, draft_load_format="dummy"))
    engine = OfflineEngine(worker, max_model_len=1024, max_num_seqs=16, **scheduler_options)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 150_000, (int(length),), generator=generator).tolist()
               for length in torch.randint(5, 300, (7,), generator=generator)]
    params = [SamplingParams(max_tokens=4 + 5 * i, temperature=0.0, ignore_eos=True) for i in range(len(prompts))]
    tokens = [result.token_ids for result in engine.generate(prompts, params)]
    del engine, worker
    torch.cuda.empty_cache()
    return tokens


def test_graph_decode_matches_eager_decode():
    graphs, eager = _greedy_tokens(enforce_eager=False), _greedy_tokens(enforce_eager=True)
    assert [len(t) for t in graphs] == [4 + 5 * i for i in range(7)]
    assert graphs == eager


def test_chunked_prefill_beside_decodes_matches_eager():
    graphs = _greedy_tokens(enforce_eager=False, max_num_batched_tokens=96)
    assert graphs == _greedy_tokens(enforce_eager=True, max_num_batched_tokens=96)


def test_ngram_verification_rows_attended_together_match_no_speculation():
    """Random weights repeat themselves, so prompt lookup proposes often: each verification's rows of a request go
    to one decode attention program (row groups) in the decode graphs and in the eager pass."""
    speculation = dict(speculative_method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=3)
    graphs = _greedy_tokens(enforce_eager=False, **speculation)
    assert graphs == _greedy_tokens(enforce_eager=True, **speculation)
    assert graphs == _greedy_tokens(enforce_eager=False)


def test_draft_model_passes_through_graphs_match_eager_and_no_speculation():
    speculation = dict(draft_model="Qwen3-0.6B", speculative_method="draft", num_speculative_tokens=3)
    graphs = _greedy_tokens(enforce_eager=False, **speculation)
    assert graphs == _greedy_tokens(enforce_eager=True, **speculation)
    assert graphs == _greedy_tokens(enforce_eager=False)
