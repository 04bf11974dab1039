"""Router-facing messages (scheduler.proto) to and from the scheduler's domain types."""
import time

from sluice.core.finish_reason import FinishReason
from sluice.core.finish_reason_pb import finish_reason_to_pb
from sluice.core.images_pb import image_from_pb
from sluice.core.kv_transfer_pb import kv_transfer_from_pb, kv_transfer_to_pb
from sluice.core.logprobs import LogprobRows, Logprobs
from sluice.core.logprobs_pb import logprob_rows_to_pb
from sluice.core.sampling_params_pb import sampling_params_from_pb
from sluice.scheduler.kv_cache.events_pb import kv_event_batch_to_pb
from sluice.scheduler.outputs import LoadSnapshot, RequestUpdate
from sluice.scheduler.request import Request
from sluice.scheduler.routers.kv_event_stream import LoadedBatch
from sluice.serving.grpc_errors import status_for
from sluice.v1 import generation_pb2, scheduler_pb2


def request_from_pb(submit: scheduler_pb2.Submit) -> Request:
    deadline = None
    if submit.deadline_unix_seconds:
        deadline = time.monotonic() + submit.deadline_unix_seconds - time.time()
    return Request(
        request_id=submit.request_id,
        prompt_token_ids=list(submit.prompt_token_ids),
        sampling_params=sampling_params_from_pb(submit.sampling),
        priority=submit.priority,
        cache_salt=submit.cache_salt or None,
        deadline=deadline,
        images=tuple(image_from_pb(image) for image in submit.images),
        kv_transfer=kv_transfer_from_pb(submit.kv_transfer),
    )


def step_update_to_pb(updates: list[RequestUpdate]) -> scheduler_pb2.StepUpdate:
    with_tokens = [u for u in updates if u.new_token_ids]
    return scheduler_pb2.StepUpdate(
        request_ids=[u.request_id for u in with_tokens],
        sample_indices=[u.sample_index for u in with_tokens],
        token_counts=[len(u.new_token_ids) for u in with_tokens],
        token_ids=[token for u in with_tokens for token in u.new_token_ids],
        finished=[_finished_to_pb(u) for u in updates if u.finished and u.error is None],
        rejections=[_rejection_to_pb(u) for u in updates if u.error is not None],
        logprobs=_logprob_rows_to_pb([(u, u.logprobs) for u in updates if u.logprobs is not None]),
        prompt_logprobs=_logprob_rows_to_pb([(u, u.prompt_logprobs) for u in updates if u.prompt_logprobs is not None]),
    )


def _logprob_rows_to_pb(parts: list[tuple[RequestUpdate, Logprobs]]) -> generation_pb2.LogprobRows | None:
    rows = LogprobRows.packed([u.request_id for u, _ in parts], [logprobs for _, logprobs in parts])
    return logprob_rows_to_pb(rows, [u.sample_index for u, _ in parts])


def _finished_to_pb(update: RequestUpdate) -> scheduler_pb2.Finished:
    return scheduler_pb2.Finished(
        request_id=update.request_id,
        reason=finish_reason_to_pb(update.finish_reason),
        usage=generation_pb2.Usage(prompt_tokens=update.num_prompt_tokens,
                                   completion_tokens=update.num_output_tokens,
                                   cached_tokens=update.num_cached_tokens),
        deadline_exceeded=update.finish_reason is FinishReason.DEADLINE,
        index=update.sample_index,
        kv_transfer=None if update.kv_transfer is None else kv_transfer_to_pb(update.kv_transfer),
    )


def _rejection_to_pb(update: RequestUpdate) -> scheduler_pb2.Rejection:
    return scheduler_pb2.Rejection(request_id=update.request_id, status_code=status_for(update.error).value[0],
                                   message=str(update.error))


def load_to_pb(load: LoadSnapshot) -> scheduler_pb2.Load:
    silence_ms = None if load.engine_silence is None else round(load.engine_silence * 1000)
    return scheduler_pb2.Load(
        num_running=load.num_running, num_waiting=load.num_waiting, num_used_blocks=load.num_used_blocks,
        num_free_blocks=load.num_free_blocks, num_total_blocks=load.num_total_blocks,
        prefix_cache_hit_rate=load.prefix_cache_hit_rate, num_preemptions=load.num_preemptions,
        num_draft_tokens=load.num_draft_tokens, num_accepted_tokens=load.num_accepted_tokens,
        num_accepted_tokens_per_position=load.num_accepted_tokens_per_position, engine_silence_ms=silence_ms,
        num_prefill_pending_tokens=load.num_prefill_pending_tokens)


def loaded_batch_to_pb(loaded: LoadedBatch) -> scheduler_pb2.KvEventBatch:
    message = kv_event_batch_to_pb(loaded.batch)
    message.load.CopyFrom(load_to_pb(loaded.load))
    message.load_sample = loaded.load_sample
    message.load_only = loaded.load_only
    return message
