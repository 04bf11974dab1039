"""The sampler's start-up warm-up launches every compiled kernel variant that a step can select: random steps of
mixed requests launch none that it did not, on the kernel path (CUDA's; on the CPU through Triton's interpreter,
whose launches are told apart as Triton's cache tells them) and, on a GPU, compile nothing after it. It leaves no
state behind in the worker."""
import random
from functools import reduce
from operator import or_

import pytest
import torch
import triton

from sluice.core.logprobs import MAX_LOGPROBS
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.sampling import kernel_path
from sluice.worker.sampling.rows import RowUses
from sluice.worker.sampling.variants import PROPOSALS, sampling_variants
from sluice.worker.sampling.warm_up import SamplerWarmUp, warm_up_sampler
from tests.worker.kernel_launches import recorded_launches

VOCAB = 256  # top-k candidates of 64 and 128 tokens, short of the vocabulary
NUM_RANDOM_STEPS = 24


def _random_params(rng: random.Random, vocab_size: int) -> SamplingParams:
    params = SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), seed=rng.choice([None, rng.getrandbits(64)]),
                            logprobs=rng.choice([None, None, rng.randint(0, MAX_LOGPROBS)]))
    if rng.random() < 0.5:
        params.top_k = rng.choice([1, 20, 33, 64, 100, 300, 512, 513, vocab_size])
    if rng.random() < 0.4:
        params.top_p = rng.choice([0.5, 0.95])
    if rng.random() < 0.3:
        params.min_p = 0.1
    if rng.random() < 0.2:
        params.repetition_penalty, params.frequency_penalty = 1.3, 0.4
    if rng.random() < 0.2:
        params.logit_bias = {5: -3.0, 7: 1.5}
    if rng.random() < 0.2:
        params.min_tokens, params.stop_token_ids = 3, [9]
    if rng.random() < 0.2:
        params.bad_words_token_ids = [[11], [12, 13]]
    if rng.random() < 0.2:
        params.allowed_token_ids = list(range(20, 60))
    return params


def _random_steps(warm_up: SamplerWarmUp, rng: random.Random) -> None:
    for _ in range(NUM_RANDOM_STEPS):
        params = [_random_params(rng, warm_up.vocab_size) for _ in range(rng.choice([1, 1, 2, 3, 5, 16]))]
        warm_up.sample(params, rng.choice(PROPOSALS), rng.choice([None, rng.randint(0, MAX_LOGPROBS)]))


def _described(variants: set) -> str:
    return "\n".join(f"{name}: {dict(arguments)}" for name, arguments in sorted(variants))


@pytest.fixture(scope="module")
def warmed_variants() -> set:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernel_path, "runs_kernels", lambda tensor: True)
        with recorded_launches(patch) as launched:
            warm_up_sampler(VOCAB, torch.device("cpu"))
    return launched


def test_every_row_use_is_in_a_variant():
    flags = [value for name, value in vars(RowUses).items() if name.isupper()]
    used = reduce(or_, (RowUses.of(variant.params(seed=0)) for variant in sampling_variants(VOCAB)))
    assert [flag for flag in flags if not used & flag] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's launches; a GPU runs the test below")
def test_random_steps_launch_no_kernel_variant_that_the_warm_up_did_not(warmed_variants, monkeypatch):
    monkeypatch.setattr(kernel_path, "runs_kernels", lambda tensor: True)
    with recorded_launches(monkeypatch) as launched:
        _random_steps(SamplerWarmUp(VOCAB, torch.device("cpu")), random.Random(0))
    assert launched, "the steps took the kernel path"
    assert not launched - warmed_variants, f"not warmed up:\n{_described(launched - warmed_variants)}"


@pytest.mark.gpu
def test_no_kernel_compiles_after_the_warm_up_on_a_gpu(monkeypatch):
    device = torch.device("cuda")
    vocab_size = 151936  # Qwen3's: every candidate width, several chunks of each kernel
    warm_up_sampler(vocab_size, device)
    compiled = []

    def record_compile(**hook) -> bool:  # Triton's jit_cache_hook, called before each compile
        compiled.append(hook["repr"])
        return False

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", record_compile)
    warm_up = SamplerWarmUp(vocab_size, device)
    rng = random.Random(1)
    for _ in range(4):
        _random_steps(warm_up, rng)
    assert compiled == []


def test_the_warm_up_leaves_the_worker_no_sampling_state():
    engine = WorkerEngine.load(WorkerConfig(model="SmolLM2-tiny", load_format="dummy", kv_cache_gib=1 / 1024))
    engine.init_cache(16, 8)
    sampler = engine.runner.sampler
    assert engine.warm_up_seconds > 0
    assert (sampler.rows.num_logprob_rows, sampler.grammars.active, engine.num_live_requests) == (0, False, 0)
    with pytest.raises(KeyError):
        sampler.rows.params("warm-up-1-0")


def test_the_warm_up_draws_nothing_from_torch_s_generator():
    state = torch.get_rng_state()
    warm_up_sampler(VOCAB, torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)
