"""The StepPlan / StepOutcome contract on the wire (worker.proto), packed as the proto describes."""
from itertools import accumulate

from sluice.core.images_pb import image_from_pb, image_to_pb
from sluice.core.logprobs_pb import logprob_rows_from_pb, logprob_rows_to_pb
from sluice.core.sampling_params_pb import sampling_params_from_pb, sampling_params_to_pb
from sluice.core.step_plan import CachedRequest, NewRequest, StepOutcome, StepPlan
from sluice.v1 import worker_pb2 as pb


def plan_to_pb(plan: StepPlan) -> pb.StepRequest:
    cached = plan.cached_requests
    return pb.StepRequest(
        step_id=plan.step_id,
        new_requests=[
            pb.NewRequest(request_id=r.request_id, token_ids=r.token_ids, block_ids=r.block_ids,
                          num_computed_tokens=r.num_computed_tokens, sampling=sampling_params_to_pb(r.sampling_params),
                          num_output_tokens=r.num_output_tokens, trace_context=r.trace_context,
                          images=[image_to_pb(image) for image in r.images])
            for r in plan.new_requests
        ],
        cached_requests=pb.CachedRequests(
            request_ids=[r.request_id for r in cached],
            new_block_counts=[len(r.new_block_ids) for r in cached],
            new_block_ids=[block for r in cached for block in r.new_block_ids],
            num_computed_tokens=[r.num_computed_tokens for r in cached],
            num_blocks=[r.num_blocks for r in cached],
        ),
        scheduled_request_ids=list(plan.num_scheduled_tokens),
        num_scheduled_tokens=list(plan.num_scheduled_tokens.values()),
        finished_request_ids=plan.finished_request_ids,
        block_copy_sources=[source for source, _ in plan.block_copies],
        block_copy_destinations=[destination for _, destination in plan.block_copies],
        spec_request_ids=list(plan.spec_token_ids),
        spec_token_counts=[len(tokens) for tokens in plan.spec_token_ids.values()],
        spec_token_ids=[token for tokens in plan.spec_token_ids.values() for token in tokens],
        draft_request_ids=list(plan.num_draft_tokens),
        num_draft_tokens=list(plan.num_draft_tokens.values()),
        freed_encoder_hashes=plan.freed_encoder_hashes,
        encoder_inputs=[image_to_pb(image) for image in plan.encoder_inputs],
    )


def plan_from_pb(message: pb.StepRequest) -> StepPlan:
    cached = message.cached_requests
    new_block_ids = _unpack(cached.request_ids, cached.new_block_counts, cached.new_block_ids)
    return StepPlan(
        step_id=message.step_id,
        new_requests=[
            NewRequest(r.request_id, list(r.token_ids), list(r.block_ids), r.num_computed_tokens,
                       sampling_params_from_pb(r.sampling), r.num_output_tokens, dict(r.trace_context),
                       [image_from_pb(image) for image in r.images])
            for r in message.new_requests
        ],
        cached_requests=[
            CachedRequest(request_id, new_block_ids[request_id], computed, num_blocks)
            for request_id, computed, num_blocks in zip(cached.request_ids, cached.num_computed_tokens,
                                                        cached.num_blocks)
        ],
        num_scheduled_tokens=dict(zip(message.scheduled_request_ids, message.num_scheduled_tokens)),
        finished_request_ids=list(message.finished_request_ids),
        block_copies=list(zip(message.block_copy_sources, message.block_copy_destinations)),
        spec_token_ids=_unpack(message.spec_request_ids, message.spec_token_counts, message.spec_token_ids),
        num_draft_tokens=dict(zip(message.draft_request_ids, message.num_draft_tokens)),
        freed_encoder_hashes=list(message.freed_encoder_hashes),
        encoder_inputs=[image_from_pb(image) for image in message.encoder_inputs],
    )


def outcome_to_pb(outcome: StepOutcome) -> pb.StepResult:
    return pb.StepResult(
        step_id=outcome.step_id, request_ids=list(outcome.sampled_token_ids),
        sampled_token_ids=list(outcome.sampled_token_ids.values()),
        logprobs=logprob_rows_to_pb(outcome.logprobs), prompt_logprobs=logprob_rows_to_pb(outcome.prompt_logprobs),
        grammar_completed_request_ids=outcome.grammar_completed_request_ids,
        grammar_errors=outcome.grammar_errors,
        accepted_request_ids=list(outcome.accepted_token_ids),
        accepted_token_counts=[len(tokens) for tokens in outcome.accepted_token_ids.values()],
        accepted_token_ids=[token for tokens in outcome.accepted_token_ids.values() for token in tokens],
    )


def outcome_from_pb(message: pb.StepResult) -> StepOutcome:
    return StepOutcome(
        message.step_id, dict(zip(message.request_ids, message.sampled_token_ids)),
        logprobs=logprob_rows_from_pb(message.logprobs),
        prompt_logprobs=logprob_rows_from_pb(message.prompt_logprobs),
        grammar_completed_request_ids=list(message.grammar_completed_request_ids),
        grammar_errors=dict(message.grammar_errors),
        accepted_token_ids=_unpack(message.accepted_request_ids, message.accepted_token_counts,
                                   message.accepted_token_ids),
    )


def _unpack(request_ids, counts, values) -> dict[str, list[int]]:
    """request_ids[i] -> the next counts[i] of values, in order."""
    if not request_ids:
        return {}
    ends = list(accumulate(counts))
    values = list(values)
    return {request_id: values[end - count:end] for request_id, count, end in zip(request_ids, counts, ends)}
