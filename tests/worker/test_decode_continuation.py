"""Decode steps that continue the step before take their inputs from the decode buffers, not from the host. On the
CPU the buffers run uncaptured, so the same bookkeeping is held here to Hugging Face's greedy output and to
`--enforce-eager` (every step built on the host): requests that finish at different lengths (rows move), a KV pool
small enough to force preemptions (rows reorder, requests rejoin), and contexts that cross block boundaries."""
import random

import pytest

from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import CachedRequest, NewRequest, StepPlan
from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

TEXTS = ["The history of the Roman Empire began", "A recipe for pancakes: first,", "The three laws of motion are",
         "Python is a programming language that", "The quick brown fox"]
MAX_TOKENS = [20, 34, 12, 28, 25]


@pytest.fixture(scope="module")
def prompts(hf_tokenizer):
    return [hf_tokenizer(text).input_ids for text in TEXTS]


def _generate(model_dir, prompts: list[list[int]], enforce_eager: bool) -> tuple[list[list[int]], int, int, int]:
    """The outputs, the steps, the steps that built their inputs on the host, and the preemptions."""
    worker = WorkerEngine.load(WorkerConfig(model=str(model_dir), enforce_eager=enforce_eager))
    engine = OfflineEngine(worker, num_blocks=6, max_num_seqs=8)  # 96 tokens of KV for 5 requests of 16 to 41
    built = []
    build = worker.runner.inputs.build
    worker.runner.inputs.build = lambda *args, **kwargs: built.append(1) or build(*args, **kwargs)
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in MAX_TOKENS]
    outputs = [result.token_ids for result in engine.generate(prompts, params)]
    return outputs, engine.num_steps, len(built), engine.scheduler.get_load().num_preemptions


def test_continued_decodes_match_hf_and_the_eager_engine(default_model_dir, hf_greedy_of, prompts):
    outputs, num_steps, num_built, num_preemptions = _generate(default_model_dir, prompts, enforce_eager=False)
    eager_outputs, eager_steps, eager_built, _ = _generate(default_model_dir, prompts, enforce_eager=True)
    assert num_preemptions > 0
    assert [len(tokens) for tokens in outputs] == MAX_TOKENS
    assert outputs == eager_outputs
    for prompt, tokens in zip(prompts, outputs):
        expected = hf_greedy_of(prompt, len(tokens))
        assert tokens[:len(expected)] == expected
    assert eager_built == eager_steps
    assert num_built < num_steps / 2


def test_a_decode_after_a_step_where_an_earlier_row_did_not_sample(default_model_dir, prompts):
    """Step 0 is laid out as a decode step but its first request only prefills one prompt token (it samples nothing);
    step 1 decodes the second request alone. Its input must be the token it sampled, not one fed to another row."""
    def two_steps(enforce_eager: bool) -> list[dict[str, int]]:
        engine = WorkerEngine.load(WorkerConfig(model=str(default_model_dir), enforce_eager=enforce_eager))
        engine.init_cache(16, 8)
        greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        first = StepPlan(0, [NewRequest("prefilling", prompts[0], [0], 0, greedy),
                             NewRequest("decoding", prompts[1][:1], [1], 0, greedy)],
                         num_scheduled_tokens={"prefilling": 1, "decoding": 1})
        second = StepPlan(1, cached_requests=[CachedRequest("decoding", [], 1, 1)],
                          num_scheduled_tokens={"decoding": 1})
        return [engine.execute(plan).sampled_token_ids for plan in (first, second)]

    outcomes = two_steps(enforce_eager=False)
    assert list(outcomes[0]) == ["decoding"]
    assert outcomes == two_steps(enforce_eager=True)


PARAGRAPH = ("The river rises in the northern hills, runs south through three market towns, and meets the sea at a "
             "wide, shallow bay where herons feed at low tide.")
QUOTES = [f"Repeat the following paragraph word for word.\nParagraph: {PARAGRAPH}\nRepeated: The river rises",
          "Say it twice: the sun is warm. Again: the", "Say it twice: bees make honey. Again: bees"]


@pytest.fixture(scope="module")
def quoted(hf_tokenizer, hf_greedy_of) -> dict[str, list[int]]:
    """Each quote's Hugging Face greedy 20 tokens (once for every layout and number of steps in flight)."""
    return {text: hf_greedy_of(hf_tokenizer(text).input_ids, 20) for text in QUOTES}


def _record_launches(worker: WorkerEngine) -> tuple[list[StepPlan], list[int]]:
    """Wraps the runner's launch: the plans launched, and for each, how many of its requests had proposals whose
    verification had not finished."""
    plans, follow_ups, launch, batch = [], [], worker.runner.launch, worker.runner.batch

    def recording_launch(plan):
        plans.append(plan)
        known = [batch.requests[r] for r in plan.num_scheduled_tokens if r in batch.requests]
        follow_ups.append(sum(1 for state in known if state.num_unverified))
        return launch(plan)

    worker.runner.launch = recording_launch
    return plans, follow_ups


def _decodes_only(plan: StepPlan) -> bool:
    return all(count == 1 + len(plan.spec_token_ids.get(request_id, ()))
               for request_id, count in plan.num_scheduled_tokens.items())


def _speculate(model_dir, prompts: list[list[int]], max_tokens: int, enforce_eager: bool, steps_in_flight: int):
    """The outputs; for each step that followed a verification and decoded some of its requests without proposals,
    whether it built its inputs on the host; the same for each verification of requests that the step before it
    decoded; and how many requests were launched before the verification of their proposals finished."""
    worker = WorkerEngine.load(WorkerConfig(model=str(model_dir), enforce_eager=enforce_eager))
    engine = OfflineEngine(worker, num_blocks=24, max_num_seqs=16, speculative_method="ngram",
                           num_speculative_tokens=3, ngram_min=1, ngram_max=3, steps_in_flight=steps_in_flight)
    plans, follow_ups = _record_launches(worker)
    built, build = set(), worker.runner.inputs.build
    worker.runner.inputs.build = lambda *args, **kwargs: built.add(plans[-1].step_id) or build(*args, **kwargs)
    params = [SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True) for _ in prompts]
    outputs = [result.token_ids for result in engine.generate(prompts, params)]
    after_verification = [plan.step_id in built for before, plan in zip(plans, plans[1:])
                          if before.spec_token_ids and not plan.spec_token_ids
                          and set(plan.num_scheduled_tokens) <= set(before.num_scheduled_tokens)
                          and all(count == 1 for count in plan.num_scheduled_tokens.values())]
    verifications = [plan.step_id in built for before, plan in zip(plans, plans[1:])
                     if plan.spec_token_ids and _decodes_only(before)
                     and set(plan.num_scheduled_tokens) <= set(before.num_scheduled_tokens)]
    return outputs, after_verification, verifications, sum(follow_ups)


@pytest.mark.parametrize("steps_in_flight", [1, MAX_STEPS_IN_FLIGHT], ids=["synchronous", "planned-ahead"])
@pytest.mark.parametrize("quotes", [QUOTES[1:2], QUOTES], ids=["alone", "together"])
def test_a_decode_after_a_verification_continues_it(default_model_dir, hf_tokenizer, quoted, quotes,
                                                    steps_in_flight):
    """ngram's verification rows are decode rows; afterwards each request keeps the row of its last accepted token,
    so the next decode builds nothing on the host, nor does a verification of requests that the step before decoded
    (its rows come from theirs), and the tokens are Hugging Face's and the eager engine's. Planned ahead, that
    decode is launched before the verification's outcome is known (its position is the device's)."""
    prompts = [hf_tokenizer(text).input_ids for text in quotes]
    outputs, after_verification, verifications, follow_ups = _speculate(default_model_dir, prompts, 20, False,
                                                                         steps_in_flight)
    eager_outputs, eager_after, eager_verifications, _ = _speculate(default_model_dir, prompts, 20, True,
                                                                    steps_in_flight)
    assert outputs == eager_outputs
    assert outputs == [quoted[text] for text in quotes]
    assert after_verification and not any(after_verification)
    assert verifications and not any(verifications)
    assert eager_after and all(eager_after) and all(eager_verifications)
    assert (follow_ups > 0) == (steps_in_flight > 1)


def _random_workload(model_dir, speculative: bool) -> tuple[list[list[int]], int]:
    """Fourteen random prompts and lengths, six running at once, planned ahead: the outputs, and how many requests
    were launched before their proposals' verification finished."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 2000) for _ in range(rng.randrange(4, 30))] for _ in range(14)]
    params = [SamplingParams(max_tokens=rng.randrange(5, 40), temperature=0.0, ignore_eos=True) for _ in prompts]
    worker = WorkerEngine.load(WorkerConfig(model=str(model_dir)))
    speculation = dict(speculative_method="ngram", num_speculative_tokens=3, ngram_min=1, ngram_max=3) \
        if speculative else {}
    engine = OfflineEngine(worker, num_blocks=64, max_num_seqs=6, steps_in_flight=MAX_STEPS_IN_FLIGHT, **speculation)
    _, follow_ups = _record_launches(worker)
    return [result.token_ids for result in engine.generate(prompts, params)], sum(follow_ups)


def test_requests_joining_and_leaving_around_verifications_keep_their_tokens(default_model_dir):
    """Decodes launched before their request's verification finished, in steps among joins, leaves and other
    verifications (a request that skips a step after such a decode has its inputs built on the host, which waits
    for the steps that hold its position and newest token): the tokens are those without speculation."""
    outputs, follow_ups = _random_workload(default_model_dir, speculative=True)
    assert follow_ups > 0
    assert outputs == _random_workload(default_model_dir, speculative=False)[0]
