from tests.scheduler.sched_testkit import FakeWorker, make_request, make_scheduler, run_to_completion, step


def _finish(scheduler, worker, request):
    scheduler.add_request(request)
    return run_to_completion(scheduler, worker)[0]


def test_prefix_hit_skips_cached_tokens_and_reports_them():
    scheduler = make_scheduler(num_blocks=32)
    worker = FakeWorker(block_size=16)
    shared = list(range(1, 41))
    first = _finish(scheduler, worker, make_request("a", shared + [7, 7], max_tokens=2))
    assert first[-1].num_cached_tokens == 0
    scheduler.add_request(make_request("b", shared + [9, 9, 9], max_tokens=2))
    plan, updates = step(scheduler, worker)  # the fake worker checks the hit blocks hold the right tokens
    assert plan.new_requests[0].num_computed_tokens == 32
    assert plan.num_scheduled_tokens == {"b": 43 - 32}
    assert updates[0].num_cached_tokens == 32
    assert scheduler.get_load().prefix_cache_hit_rate == 32 / (42 + 43)


def test_whole_prompt_cached_still_computes_the_last_token():
    scheduler = make_scheduler(num_blocks=32)
    worker = FakeWorker(block_size=16)
    prompt = list(range(1, 33))
    _finish(scheduler, worker, make_request("a", prompt, max_tokens=3))
    scheduler.add_request(make_request("b", prompt, max_tokens=3))
    plan, _ = step(scheduler, worker)
    assert plan.new_requests[0].num_computed_tokens == 16 and plan.num_scheduled_tokens == {"b": 16}


def test_running_requests_share_prefix_blocks():
    scheduler = make_scheduler(num_blocks=32)
    worker = FakeWorker(block_size=16)
    shared = list(range(1, 33))
    scheduler.add_request(make_request("a", shared + [5], max_tokens=20))
    step(scheduler, worker)
    scheduler.add_request(make_request("b", shared + [6], max_tokens=20))
    plan, _ = step(scheduler, worker)
    a_blocks, b_blocks = (scheduler.block_manager.block_ids(r) for r in "ab")
    assert a_blocks[:2] == b_blocks[:2] and a_blocks[2] != b_blocks[2]
    assert scheduler.get_load().num_used_blocks == 4
    run_to_completion(scheduler, worker)


def test_cache_salt_isolates_prefixes():
    scheduler = make_scheduler(num_blocks=32)
    worker = FakeWorker(block_size=16)
    prompt = list(range(1, 40))
    _finish(scheduler, worker, make_request("a", prompt, max_tokens=1, cache_salt="tenant-1"))
    scheduler.add_request(make_request("b", prompt, max_tokens=1, cache_salt="tenant-2"))
    assert step(scheduler, worker)[0].new_requests[0].num_computed_tokens == 0
    scheduler.add_request(make_request("c", prompt, max_tokens=1, cache_salt="tenant-1"))
    assert step(scheduler, worker)[0].new_requests[0].num_computed_tokens == 32


def test_prefix_caching_disabled_never_hits():
    scheduler = make_scheduler(num_blocks=32, enable_prefix_caching=False)
    worker = FakeWorker(block_size=16)
    prompt = list(range(1, 40))
    _finish(scheduler, worker, make_request("a", prompt, max_tokens=1))
    scheduler.add_request(make_request("b", prompt, max_tokens=1))
    assert step(scheduler, worker)[0].new_requests[0].num_computed_tokens == 0


def test_freed_cached_blocks_are_evicted_least_recently_freed_first():
    scheduler = make_scheduler(num_blocks=8)
    worker = FakeWorker(block_size=16)
    old, recent = list(range(1, 34)), list(range(100, 133))
    _finish(scheduler, worker, make_request("old", old, max_tokens=1))
    _finish(scheduler, worker, make_request("recent", recent, max_tokens=1))
    # the filler's 5 blocks: the 4 never-cached ones first, then one eviction, which takes the tail of the least
    # recently freed prefix
    _finish(scheduler, worker, make_request("filler", 70, max_tokens=1))
    scheduler.add_request(make_request("again-recent", recent, max_tokens=1))
    scheduler.add_request(make_request("again-old", old, max_tokens=1))
    plan, _ = step(scheduler, worker)
    hits = {new.request_id: new.num_computed_tokens for new in plan.new_requests}
    assert hits == {"again-recent": 32, "again-old": 16}
