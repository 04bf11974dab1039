"""The StepPlan / StepOutcome contract survives the wire (worker.proto) with every field set."""
from sluice.core.images import ImageInput
from sluice.core.logprobs import LogprobRows, Logprobs
from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import CachedRequest, NewRequest, StepOutcome, StepPlan
from sluice.core.step_plan_pb import outcome_from_pb, outcome_to_pb, plan_from_pb, plan_to_pb


def test_plan_round_trip():
    params = SamplingParams(max_tokens=9, temperature=0.5, top_p=0.75, top_k=7, seed=2**64 - 1, n=2,
                            presence_penalty=0.5, logit_bias={3: -1.5}, stop=["END"], logprobs=2, prompt_logprobs=0,
                            choice=["a", "b"])
    image = ImageInput(b"hash", 1, 1, (1, 2, 2), bytes(range(32)), (4, 2))
    plan = StepPlan(4, [NewRequest("x#1", [1, 2, 3], [5, 6], 2, params, num_output_tokens=1,
                                   images=[image.without_pixels()])],
                    [CachedRequest("y", [8], 10, 3), CachedRequest("w", [], 4, 1)], {"x#1": 1, "y": 3, "w": 1}, ["z"],
                    block_copies=[(6, 9), (2, 3)], spec_token_ids={"y": [11, 12], "w": []},
                    freed_encoder_hashes=[b"old", b"older"], encoder_inputs=[image])
    assert plan_from_pb(plan_to_pb(plan)) == plan
    drafting = StepPlan(5, cached_requests=[CachedRequest("y", [], 10, 3)], num_scheduled_tokens={"y": 4, "w": 1},
                        num_draft_tokens={"y": 3, "w": 0})
    assert plan_from_pb(plan_to_pb(drafting)) == drafting
    assert drafting.num_proposed == {"y": 3, "w": 0} and plan.num_proposed == {"y": 2, "w": 0}


def test_outcome_round_trip():
    logprobs = Logprobs(2, [7], [-0.5], [1], [7, 8], [-0.5, -1.5])
    prompt_logprobs = Logprobs(0, [1, 2], [-1.0, -2.0], [3, 4])
    outcome = StepOutcome(4, {"x": 7, "y": 3}, logprobs=LogprobRows.packed(["x"], [logprobs]),
                          prompt_logprobs=LogprobRows.packed(["y", "x"], [prompt_logprobs, logprobs]),
                          grammar_completed_request_ids=["y"], grammar_errors={"x": "no token continues it"},
                          accepted_token_ids={"y": [], "x": [5, 6]})
    assert outcome_from_pb(outcome_to_pb(outcome)) == outcome
