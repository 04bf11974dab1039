"""The load record the router puts on each KV event batch it relays to smg: the numbers its GetLoads answers with,
the engine's silence and prefill in hand, and the telemetry on the stream's first record and load-only batches."""
from sluice.router.vllm.info_pb import loads_to_vllm_pb
from sluice.router.vllm.kv_events_pb import kv_event_batch_to_vllm_pb
from sluice.v1 import scheduler_pb2

BLOCK = 16
LOAD = scheduler_pb2.Load(num_running=3, num_waiting=2, num_used_blocks=24, num_free_blocks=40, num_total_blocks=64,
                          prefix_cache_hit_rate=0.25, engine_silence_ms=1500, num_prefill_pending_tokens=700)


def _relayed(load_sample: int, load_only: bool, load: scheduler_pb2.Load = LOAD):
    batch = scheduler_pb2.KvEventBatch(sequence_number=7, timestamp=1.5, load=load, load_sample=load_sample,
                                       load_only=load_only)
    return kv_event_batch_to_vllm_pb(batch, BLOCK)


def test_an_event_batch_carries_the_numbers_get_loads_answers_with_and_the_engine_silence():
    polled = loads_to_vllm_pb([LOAD], BLOCK).loads[0]
    batch = _relayed(load_sample=5, load_only=False)
    record = batch.load
    assert (batch.sequence_number, record.sample, record.load_only) == (7, 5, False)
    assert (record.running_requests, record.waiting_requests) == (polled.num_running_reqs, polled.num_waiting_reqs)
    assert record.token_usage == record.active_token_usage == polled.token_usage == 24 / 64
    assert record.max_running_requests == polled.max_running_requests
    assert (record.engine_silence_ms, record.prefill_pending_tokens, record.engine_reports_steps) == (1500, 700, True)
    assert not record.HasField("waiting_uncached_tokens")
    assert not any(record.HasField(name) for name in ("cache_hit_rate", "num_used_tokens", "max_total_num_tokens"))


def test_the_first_record_and_load_only_batches_carry_the_telemetry_too():
    polled = loads_to_vllm_pb([LOAD], BLOCK).loads[0]
    for record in (_relayed(load_sample=1, load_only=False).load, _relayed(load_sample=9, load_only=True).load):
        assert record.cache_hit_rate == polled.cache_hit_rate == 0.25
        assert (record.num_used_tokens, record.max_total_num_tokens) == (24 * BLOCK, 64 * BLOCK)
    assert _relayed(load_sample=9, load_only=True).load.load_only


def test_an_engine_with_nothing_in_flight_reports_no_silence():
    idle = scheduler_pb2.Load(num_total_blocks=64, num_free_blocks=64)
    record = _relayed(load_sample=2, load_only=True, load=idle).load
    assert not record.HasField("engine_silence_ms")
    assert (record.running_requests, record.token_usage, record.prefill_pending_tokens) == (0, 0.0, 0)


def test_a_batch_without_a_load_relays_none():
    batch = kv_event_batch_to_vllm_pb(scheduler_pb2.KvEventBatch(sequence_number=3, timestamp=1.0), BLOCK)
    assert not batch.HasField("load")
