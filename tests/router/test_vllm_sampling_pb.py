"""Every field of vLLM's SamplingParams message as the router's engine protocol reads and checks it: each field has
cases here, a value with the generation it means or a value refused with the field named, so a field that a newer
smg-grpc-proto adds fails this test until it is given the native API's meaning."""
import math
from dataclasses import dataclass, field, replace

import pytest
from smg_grpc_proto.generated import vllm_engine_pb2 as vllm

from sluice.core.errors import InvalidArgument
from sluice.core.sampling_params import SamplingParams
from sluice.router.request_checks import RequestChecks
from sluice.router.tokenizer import RouterTokenizer
from sluice.router.vllm.sampling_pb import sampling_params_from_vllm_pb, truncate_prompt_tokens

MAX_MODEL_LEN = 2048
PROMPT = [1, 2, 3, 4, 5]
OUT_OF_VOCABULARY = 10**7
# what smg sends for a request that sets nothing
SMG_UNSET = {"top_p": 1.0, "repetition_penalty": 1.0, "n": 1, "skip_special_tokens": True,
             "spaces_between_special_tokens": True}


@dataclass(frozen=True)
class Meaning:
    fields: dict
    params: dict = field(default_factory=dict)  # the domain fields that differ from the defaults
    prompt: list[int] = field(default_factory=lambda: PROMPT)  # the prompt the router keeps


@dataclass(frozen=True)
class Refusal:
    fields: dict
    field: str  # the INVALID_ARGUMENT's field


CASES: dict[str, list[Meaning | Refusal]] = {
    "temperature": [Meaning({"temperature": 0.0}, {"temperature": 0.0}),
                    Meaning({"temperature": 0.5}, {"temperature": 0.5}),
                    Refusal({"temperature": -1.0}, "sampling.temperature")],
    "top_p": [Meaning({"top_p": 0.5}, {"top_p": 0.5}), Refusal({"top_p": 0.0}, "sampling.top_p"),
              Refusal({"top_p": 1.5}, "sampling.top_p")],
    "top_k": [Meaning({"top_k": 5}, {"top_k": 5}), Meaning({"top_k": 0}, {"top_k": -1})],
    "min_p": [Meaning({"min_p": 0.25}, {"min_p": 0.25}), Refusal({"min_p": 1.5}, "sampling.min_p")],
    "frequency_penalty": [Meaning({"frequency_penalty": 0.5}, {"frequency_penalty": 0.5}),
                          Refusal({"frequency_penalty": 2.5}, "sampling.frequency_penalty")],
    "presence_penalty": [Meaning({"presence_penalty": -0.5}, {"presence_penalty": -0.5}),
                         Refusal({"presence_penalty": -2.5}, "sampling.presence_penalty")],
    "repetition_penalty": [Meaning({"repetition_penalty": 1.25}, {"repetition_penalty": 1.25}),
                           Refusal({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
                           Refusal({"repetition_penalty": -1.0}, "sampling.repetition_penalty"),
                           Refusal({"repetition_penalty": math.nan}, "sampling.repetition_penalty")],
    "max_tokens": [Meaning({"max_tokens": 7}, {"max_tokens": 7}), Refusal({"max_tokens": 0}, "sampling.max_tokens"),
                   Refusal({"max_tokens": MAX_MODEL_LEN}, "sampling.max_tokens")],
    "min_tokens": [Meaning({"min_tokens": 3}, {"min_tokens": 3}),
                   Refusal({"min_tokens": 9, "max_tokens": 8}, "sampling.min_tokens")],
    "stop": [Meaning({"stop": ["END"]}, {"stop": ["END"]}), Refusal({"stop": [""]}, "sampling.stop")],
    "stop_token_ids": [Meaning({"stop_token_ids": [7]}, {"stop_token_ids": [7]}),
                       Refusal({"stop_token_ids": [OUT_OF_VOCABULARY]}, "sampling.stop_token_ids")],
    "skip_special_tokens": [Meaning({"skip_special_tokens": False})],
    "spaces_between_special_tokens": [Meaning({"spaces_between_special_tokens": False})],
    "ignore_eos": [Meaning({"ignore_eos": True}, {"ignore_eos": True})],
    "n": [Meaning({"n": 3}, {"n": 3}), Refusal({"n": 0}, "sampling.n"), Refusal({"n": 17}, "sampling.n")],
    "logprobs": [Meaning({"logprobs": 0}, {"logprobs": 0}), Meaning({"logprobs": 3}, {"logprobs": 3}),
                 Refusal({"logprobs": -1}, "sampling_params.logprobs"), Refusal({"logprobs": 21}, "sampling.logprobs")],
    "prompt_logprobs": [Meaning({"prompt_logprobs": 2}, {"prompt_logprobs": 2}),
                        Refusal({"prompt_logprobs": -1}, "sampling_params.prompt_logprobs")],
    "seed": [Meaning({"seed": 7}, {"seed": 7}), Refusal({"seed": -1}, "sampling_params.seed")],
    "include_stop_str_in_output": [Meaning({"include_stop_str_in_output": True}, {"include_stop_str_in_output": True})],
    "logit_bias": [Meaning({"logit_bias": {5: -100.0, 6: 2.5}}, {"logit_bias": {5: -100.0, 6: 2.5}}),
                   Refusal({"logit_bias": {OUT_OF_VOCABULARY: 1.0}}, "sampling.logit_bias"),
                   Refusal({"logit_bias": {-1: 1.0}}, "sampling.logit_bias"),
                   Refusal({"logit_bias": {5: 1000.0}}, "sampling.logit_bias"),
                   Refusal({"logit_bias": {5: math.nan}}, "sampling.logit_bias")],
    "truncate_prompt_tokens": [Meaning({"truncate_prompt_tokens": 2}, prompt=PROMPT[-2:]),
                               Meaning({"truncate_prompt_tokens": -1}),
                               Refusal({"truncate_prompt_tokens": 0}, "sampling.truncate_prompt_tokens")],
    "grammar_from_first_token": [Meaning({"grammar_from_first_token": True, "regex": "a+"}, {"regex": "a+"})],
    "json_schema": [Meaning({"json_schema": '{"type": "object"}'}, {"json_schema": '{"type": "object"}'}),
                    Refusal({"json_schema": "{not json"}, "sampling.json_schema")],
    "regex": [Meaning({"regex": "a+"}, {"regex": "a+"}), Refusal({"regex": "[a-"}, "sampling.regex")],
    "grammar": [Meaning({"grammar": 'start: "yes" | "no"'}, {"grammar": 'start: "yes" | "no"'}),
                Refusal({"grammar": "start: undefined_rule"}, "sampling.grammar")],
    "structural_tag": [Refusal({"structural_tag": "{}"}, "sampling_params.structural_tag")],
    "json_object": [Meaning({"json_object": True}, {"json_schema": '{"type": "object"}'}),
                    Meaning({"json_object": False})],
    "choice": [Meaning({"choice": vllm.ChoiceConstraint(choices=["yes", "no"])}, {"choice": ["yes", "no"]}),
               Refusal({"choice": vllm.ChoiceConstraint()}, "sampling.choice")],
}


@pytest.fixture(scope="module")
def checks(default_model_dir) -> RequestChecks:
    return RequestChecks(RouterTokenizer(default_model_dir), MAX_MODEL_LEN)


def _as_generated(fields: dict, checks: RequestChecks) -> tuple[list[int], SamplingParams]:
    """The prompt and parameters the router generates from a Generate with these sampling fields, checked as its
    servicer checks them."""
    message = vllm.SamplingParams(**{**SMG_UNSET, **fields})
    prompt = checks.prompt(PROMPT, truncate_prompt_tokens(message, MAX_MODEL_LEN), "tokenized")
    return prompt, checks.sampling(sampling_params_from_vllm_pb(message, checks.defaults(len(prompt))), len(prompt))


def test_every_field_of_the_message_has_cases():
    assert sorted(CASES) == sorted(field.name for field in vllm.SamplingParams.DESCRIPTOR.fields)
    assert all(CASES.values())


def test_a_request_that_sets_nothing_generates_with_the_defaults(checks):
    assert _as_generated({}, checks) == (PROMPT, checks.defaults(len(PROMPT)))


@pytest.mark.parametrize("case", [case for cases in CASES.values() for case in cases if isinstance(case, Meaning)],
                         ids=lambda case: ",".join(case.fields))
def test_a_field_has_the_native_meaning(checks, case):
    prompt, params = _as_generated(case.fields, checks)
    assert prompt == case.prompt
    assert params == replace(checks.defaults(len(case.prompt)), **case.params)


@pytest.mark.parametrize("case", [case for cases in CASES.values() for case in cases if isinstance(case, Refusal)],
                         ids=lambda case: ",".join(f"{name}={value}" for name, value in case.fields.items()))
def test_a_bad_value_is_refused_as_the_native_api_refuses_it(checks, case):
    with pytest.raises(InvalidArgument) as refused:
        _as_generated(case.fields, checks)
    assert refused.value.field == case.field
