"""Speculative decoding in the scheduler: ngram proposals, the slots reserved for the worker's draft model, the steps
that carry them, and the bookkeeping of what the worker accepted (tokens, KV slots, prefix-cache hashes), against the
fake worker's token-level KV cache."""
import pytest

from sluice.scheduler.scheduler import MAX_STEPS_IN_FLIGHT
from sluice.scheduler.speculation.ngram_proposer import NgramProposer
from sluice.scheduler.speculation.policy import MAX_SKIPS
from tests.scheduler.sched_testkit import (FakeWorker, cycling_model, make_request, make_scheduler, run_ahead,
                                           run_to_completion, step)

NGRAM = dict(speculative_method="ngram", num_speculative_tokens=4, ngram_min=1, ngram_max=3)
DRAFT = dict(speculative_method="draft", num_speculative_tokens=4)
each_method = pytest.mark.parametrize("speculation", [NGRAM, DRAFT], ids=["ngram", "draft"])


def _draft_model(context: list[int]) -> int:
    """The fake worker's draft model: the cycling model, but wrong at every 5th position."""
    return cycling_model(context) if len(context) % 5 else 1 + context[-1] % 12


def _worker() -> FakeWorker:
    return FakeWorker(block_size=4, model=cycling_model, draft_model=_draft_model)


def _outputs(updates) -> dict[str, list[int]]:
    outputs = {}
    for update in updates:
        outputs.setdefault(update.request_id, []).extend(update.new_token_ids)
    return outputs


def _run(requests, num_blocks: int = 64, steps_in_flight: int = 1, model=cycling_model, **config):
    scheduler = make_scheduler(num_blocks=num_blocks, block_size=4, **config)
    worker = FakeWorker(block_size=4, model=model, draft_model=_draft_model)
    for request in requests:
        scheduler.add_request(request)
    updates, steps = run_ahead(scheduler, worker, steps_in_flight)
    assert scheduler.block_manager.num_used_blocks == 0
    return _outputs(updates), steps, scheduler


def _prompt(length: int) -> list[int]:
    tokens = [3]
    while len(tokens) < length:
        tokens.append(cycling_model(tokens))
    return tokens


def test_proposer_takes_the_longest_and_latest_match():
    proposer = NgramProposer(ngram_min=1, ngram_max=3)
    request = make_request("r", [5, 6, 7, 1, 9, 6, 7, 2, 3, 6, 7], max_tokens=8)
    assert proposer.propose(request, 3) == [2, 3, 6]  # "6 7" last seen before "2"; no earlier "3 6 7"
    request.append_output_token(2)
    assert proposer.propose(request, 2) == [3, 6]  # "6 7 2" matches now, the longest
    request.append_output_token(8)
    assert proposer.propose(request, 4) == []  # 8 never occurred before


def test_proposer_ignores_matches_across_token_boundaries():
    """As int32 bytes, [2**24 + 2**16, 0] holds 257's bytes at an offset that is not a token boundary."""
    proposer = NgramProposer(ngram_min=1, ngram_max=1)
    assert proposer.propose(make_request("a", [2**24 + 2**16, 0, 5, 257]), 2) == []
    assert proposer.propose(make_request("b", [257, 9, 2**24 + 2**16, 0, 5, 257]), 2) == [9, 2**24 + 2**16]


@each_method
def test_greedy_outputs_match_decoding_without_speculation_in_fewer_steps(speculation):
    def requests():
        return [make_request(f"r{i}", _prompt(20 + i), max_tokens=30 + i) for i in range(4)]

    plain, plain_steps, _ = _run(requests())
    speculative, speculative_steps, scheduler = _run(requests(), **speculation)
    assert speculative == plain
    assert all(len(plain[f"r{i}"]) == 30 + i for i in range(4))
    assert speculative_steps < plain_steps
    load = scheduler.get_load()
    assert 0 < load.num_accepted_tokens < load.num_draft_tokens  # some proposals were rejected
    assert load.num_accepted_tokens_per_position[0] >= load.num_accepted_tokens_per_position[-1] > 0
    assert sum(load.num_accepted_tokens_per_position) == load.num_accepted_tokens


@each_method
def test_a_stop_token_among_accepted_proposals_ends_the_request_there(speculation):
    unstopped = _run([make_request("r", _prompt(20), max_tokens=40)])[0]["r"]
    stop_token = next(token for i, token in enumerate(unstopped) if i >= 6 and token not in unstopped[:i])
    plain, _, _ = _run([make_request("r", _prompt(20), max_tokens=40, stop_token_ids=[stop_token])])
    speculative, _, scheduler = _run([make_request("r", _prompt(20), max_tokens=40, stop_token_ids=[stop_token])],
                                     **speculation)
    assert speculative == plain and plain["r"] == unstopped[:unstopped.index(stop_token) + 1]
    assert scheduler.get_load().num_accepted_tokens > 0


@each_method
@pytest.mark.parametrize("max_tokens", [1, 2, 5, 13])
def test_never_proposes_past_max_tokens_or_the_model_length(max_tokens, speculation):
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_model_len=40, **speculation)
    worker = _worker()
    scheduler.add_request(make_request("short", _prompt(20), max_tokens=max_tokens))
    scheduler.add_request(make_request("long", _prompt(30), max_tokens=10))  # up to the model length
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        for request_id, num_proposed in plan.num_proposed.items():
            request = scheduler.get_request(request_id)
            assert request.num_output_tokens + 1 + num_proposed <= request.sampling_params.max_tokens
            assert request.num_tokens + 1 + num_proposed <= 40
        scheduler.update_from_outcome(plan, worker.execute(plan))
    assert {rid: len(tokens) for rid, tokens in worker.sampled_log.items()} == {"short": max_tokens, "long": 10}


@each_method
def test_rejected_proposals_free_their_blocks_and_never_reach_the_prefix_cache(speculation):
    """After each step every running request holds exactly the blocks of its computed tokens, and a second request
    whose prompt is the first's prompt and output hits its cached blocks, whose KV the fake worker checks."""
    scheduler = make_scheduler(num_blocks=64, block_size=4, **speculation)
    worker = _worker()
    first = make_request("first", _prompt(9), max_tokens=40)
    scheduler.add_request(first)
    while scheduler.has_unfinished_requests():
        step(scheduler, worker)
        if first.status.name == "RUNNING" and not first.num_output_placeholders:
            assert scheduler.block_manager.num_blocks("first") == -(-first.num_computed_tokens // 4)
    assert scheduler.get_load().num_draft_tokens > scheduler.get_load().num_accepted_tokens > 0
    second = make_request("second", first.all_token_ids + [1], max_tokens=4)
    scheduler.add_request(second)
    run_to_completion(scheduler, worker)
    assert second.num_cached_tokens == (len(first.all_token_ids) // 4) * 4


@each_method
@pytest.mark.parametrize("steps_in_flight", [1, MAX_STEPS_IN_FLIGHT], ids=["synchronous", "planned-ahead"])
def test_preemption_with_proposals_in_flight_keeps_outputs_and_blocks_exact(speculation, steps_in_flight):
    def requests():
        return [make_request(f"r{i}", _prompt(10 + i), max_tokens=24 + 3 * i) for i in range(6)]

    plain, _, _ = _run(requests())
    speculative, _, scheduler = _run(requests(), num_blocks=14, steps_in_flight=steps_in_flight, **speculation)
    assert speculative == plain
    assert scheduler.num_preemptions > 0


@each_method
def test_requests_that_cannot_speculate_get_no_proposals(speculation):
    scheduler = make_scheduler(num_blocks=64, block_size=4, **speculation)
    worker = _worker()
    cannot = {"bad_words": dict(bad_words_token_ids=[[4]]), "min_tokens": dict(min_tokens=19)}
    if speculation is DRAFT:  # the draft model samples without the penalties of its own proposals
        cannot["penalised"] = dict(presence_penalty=0.5)
    for request_id, params in cannot.items():
        scheduler.add_request(make_request(request_id, _prompt(20), max_tokens=20, **params))
    proposed = set()
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, worker)
        proposed |= set(plan.num_proposed)
    assert proposed == set()


def test_planned_ahead_requests_propose_after_guesses_and_keep_greedy_outputs():
    """With steps planned while others run, a request whose newest tokens are still being sampled gets proposals
    made after guesses of them; a wrong guess only gets its proposals rejected, and the outputs stay the greedy ones."""
    def requests():
        return [make_request(f"r{i}", _prompt(20 + i), max_tokens=40 + i) for i in range(4)]

    plain, plain_steps, _ = _run(requests(), steps_in_flight=MAX_STEPS_IN_FLIGHT)
    speculative, steps, scheduler = _run(requests(), steps_in_flight=MAX_STEPS_IN_FLIGHT, **NGRAM)
    assert speculative == plain and steps < plain_steps
    load = scheduler.get_load()
    assert 0 < load.num_accepted_tokens < load.num_draft_tokens


def _verifying_before(scheduler, plan) -> set[str]:
    """The requests whose proposals were in flight when the plan was made (none proposes again until verified)."""
    return set(scheduler.speculation._verifying) - set(plan.num_proposed)


def test_verifying_requests_decode_on_rather_than_leave_the_device_idle():
    """Planned ahead, requests whose proposals are being verified wait for the outcome unless the step would carry
    nothing else: then they take their next decode at the slot after the proposals (the worker's decode continues
    from the last accepted one), and go on decoding until the outcome, in steps that only decode; a step that also
    prefills leaves them to wait. Outputs stay the greedy ones, no token past max_tokens is sampled, and no block is
    left."""
    def requests():
        return [make_request("r0", _prompt(20), max_tokens=40), make_request("r1", _prompt(21), max_tokens=37)]

    plain, _, _ = _run(requests(), steps_in_flight=MAX_STEPS_IN_FLIGHT)
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=8, **NGRAM)
    worker = _worker()
    for request in requests():
        scheduler.add_request(request)
    follow_ups, held, followers = {True: 0, False: 0}, [0], set()

    def on_plan(plan):
        nonlocal followers
        verifying, scheduled = _verifying_before(scheduler, plan), set(plan.num_scheduled_tokens)
        decodes_only = not plan.new_requests and all(count == 1 + plan.num_proposed.get(request_id, 0)
                                                      for request_id, count in plan.num_scheduled_tokens.items())
        following = verifying & scheduled
        if following != scheduled:  # among other requests: only those that began following in an empty step
            assert following <= followers
        followers = (followers & verifying) | following
        follow_ups[decodes_only] += len(following)
        held[0] += 0 if decodes_only else len(verifying - scheduled)

    def on_outcome(plan, outcome):
        if scheduler.get_request("late") is None and "late" not in worker.sampled_log \
                and 12 <= len(worker.sampled_log["r0"]) < 40:
            scheduler.add_request(make_request("late", _prompt(30), max_tokens=4))  # prefills in 8-token chunks

    updates, _ = run_ahead(scheduler, worker, MAX_STEPS_IN_FLIGHT, on_plan=on_plan, on_outcome=on_outcome)
    assert {k: v for k, v in _outputs(updates).items() if k != "late"} == plain
    assert follow_ups[True] > 0 and follow_ups[False] == 0 and held[0] > 0
    assert {request_id: len(tokens) for request_id, tokens in worker.sampled_log.items()} == \
        {"r0": 40, "r1": 37, "late": 4}
    assert scheduler.block_manager.num_used_blocks == 0


def _never_repeating_model(context: list[int]) -> int:
    """1 2 1 3 1 4 ...: after each 1 comes a token that never came before, so every proposal is wrong."""
    return 1 if context[-1] != 1 else context.count(1) + 1


def _pure_cycle_model(context: list[int]) -> int:
    """A cycle of 12 tokens, never broken: every ngram proposal is right."""
    return 1 + context[-1] % 12


@pytest.mark.parametrize("model", [_pure_cycle_model, cycling_model], ids=["all-accepted", "some-rejected"])
def test_only_requests_whose_last_proposals_failed_decode_before_their_outcome(model):
    """Alone (so waiting idles the device), a request whose proposals are being accepted waits for each outcome, as
    its next proposals, made from the real tokens, are worth it; one whose last verification accepted nothing
    decodes on."""
    scheduler = make_scheduler(num_blocks=128, block_size=4, **NGRAM)
    prompt = [3]
    while len(prompt) < 24:
        prompt.append(model(prompt))
    scheduler.add_request(make_request("r", prompt, max_tokens=300))
    followed, last_accepted = [], [None]

    def on_plan(plan):
        if _verifying_before(scheduler, plan) & set(plan.num_scheduled_tokens):
            assert last_accepted[0] == 0  # the verification before the one in flight accepted nothing
            followed.append(plan.step_id)

    def on_outcome(plan, outcome):
        if plan.spec_token_ids:
            last_accepted[0] = len(outcome.accepted_token_ids["r"])

    run_ahead(scheduler, FakeWorker(block_size=4, model=model), MAX_STEPS_IN_FLIGHT, on_plan=on_plan,
              on_outcome=on_outcome)
    load = scheduler.get_load()
    assert 0 < load.num_accepted_tokens <= load.num_draft_tokens
    assert bool(followed) == (load.num_accepted_tokens < load.num_draft_tokens)


def test_requests_whose_proposals_all_fail_propose_ever_less_often():
    """Proposals cost a request a step's wait; after verifications that accept nothing a request lets 1, 3, 7, ...
    chances to propose pass."""
    outputs, _, scheduler = _run([make_request("r", [1, 2, 1, 3, 1], max_tokens=400)], num_blocks=128,
                                 model=_never_repeating_model, **NGRAM)
    load = scheduler.get_load()
    assert len(outputs["r"]) == 400 and load.num_accepted_tokens == 0
    num_drafts = scheduler.speculation.stats.num_drafts
    assert 0 < num_drafts <= 6 + 400 // (MAX_SKIPS + 1)


def test_a_step_carries_proposals_only_while_its_rows_fit_max_num_seqs():
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_seqs=6, **NGRAM)
    worker = FakeWorker(block_size=4, model=cycling_model)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", _prompt(20 + i), max_tokens=30))
    proposed = 0
    while scheduler.has_unfinished_requests():
        plan, _ = step(scheduler, worker)
        num_proposals = sum(map(len, plan.spec_token_ids.values()))
        assert len(plan.num_scheduled_tokens) + num_proposals <= 6
        proposed += num_proposals
    assert proposed > 0


def test_draft_steps_reserve_slots_without_tokens_and_release_the_rejected_ones():
    """A draft step computes the newest token and K empty slots in blocks of the request's own; after it, the request
    keeps the slots of its newest token and of the drafts it accepted, and a block left holding none goes back."""
    scheduler = make_scheduler(num_blocks=64, block_size=4, **DRAFT)
    worker = _worker()
    request = make_request("r", _prompt(9), max_tokens=40)
    scheduler.add_request(request)
    num_draft_steps = num_released = 0
    while scheduler.has_unfinished_requests():
        computed = request.num_computed_tokens
        plan = scheduler.schedule()
        num_drafts = plan.num_draft_tokens.get("r")
        if num_drafts is not None:
            num_draft_steps += 1
            assert plan.spec_token_ids == {} and plan.num_scheduled_tokens["r"] == 1 + num_drafts
            reserved = scheduler.block_manager.num_blocks("r")
            assert reserved == -(-(computed + 1 + num_drafts) // 4)
        outcome = worker.execute(plan)
        scheduler.update_from_outcome(plan, outcome)
        if num_drafts is not None and not request.is_finished:
            assert request.num_computed_tokens == computed + 1 + len(outcome.accepted_token_ids["r"])
            assert scheduler.block_manager.num_blocks("r") == -(-request.num_computed_tokens // 4)
            num_released += reserved - scheduler.block_manager.num_blocks("r")
    load = scheduler.get_load()
    assert num_draft_steps == load.num_drafts > 0 and num_released > 0
    assert load.num_draft_tokens > load.num_accepted_tokens > 0
    assert scheduler.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("speculation, params", [
    (NGRAM, dict(regex="a+")), (DRAFT, dict(regex="a+")), (NGRAM, dict(logprobs=2)), (DRAFT, dict(logprobs=2)),
    (NGRAM, dict(repetition_penalty=1.2, frequency_penalty=0.3))],
    ids=["ngram-regex", "draft-regex", "ngram-logprobs", "draft-logprobs", "ngram-penalties"])
def test_structured_output_logprobs_and_penalised_requests_get_proposals(speculation, params):
    """The worker masks each verification row as its grammar stands after the proposals before it, counts those
    proposals in the row's penalties and reports the logprobs of every token a request takes, so these requests
    speculate as others do."""
    outputs, _, scheduler = _run([make_request("r", _prompt(20), max_tokens=20, **params)], **speculation)
    assert len(outputs["r"]) == 20 and scheduler.get_load().num_draft_tokens > 0
