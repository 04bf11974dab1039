import grpc
import pytest

from sluice.client import text_request
from sluice.router.validation import MAX_BAD_WORDS, MAX_LOGPROBS, MAX_N, MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS
from sluice.v1 import generation_pb2 as pb
from tests.e2e.served_images import TEXT, VisionTokens, image_prompt, processed_images, served, submit
from tests.worker.tiny_qwen2_5_vl import IMAGE_TOKEN, VISION_END, VISION_START


def test_client_cancel_frees_blocks(services):
    before = services.wait_until_idle()
    call = services.client.stream(text_request("Tell me a very long story about dragons.", max_tokens=500,
                                               temperature=0.0, ignore_eos=True))
    chunks = 0
    for response in call:
        chunks += response.HasField("chunk")
        if chunks == 3:
            break
    assert services.load().num_running == 1
    call.cancel()
    after = services.wait_until_idle()
    assert after.num_free_blocks == before.num_free_blocks
    assert after.num_used_blocks == before.num_used_blocks


def test_abort_rpc_ends_the_stream(services):
    request = text_request("Count from one to a thousand:", max_tokens=500, temperature=0.0, ignore_eos=True)
    request.request_id = "abort-me"
    call = services.client.stream(request)
    next(call)
    assert services.client.abort("abort-me")
    last = list(call)[-1]
    assert last.complete.finish_reason == pb.FINISH_REASON_ABORT
    services.wait_until_idle()


@pytest.mark.parametrize("request_, field", [
    (pb.GenerateRequest(text=""), "text"),
    (pb.GenerateRequest(), "input"),
    (pb.GenerateRequest(tokens=pb.TokenIds()), "tokens"),
    (pb.GenerateRequest(tokens=pb.TokenIds(ids=[1, 10**7])), "tokens"),
    (pb.GenerateRequest(chat=pb.ChatMessages()), "chat"),
    (text_request("hi", max_tokens=0), "sampling.max_tokens"),
    (text_request("hi", max_tokens=10**6), "sampling.max_tokens"),
    (text_request("hi", temperature=-1.0), "sampling.temperature"),
    (text_request("hi", temperature=float("nan")), "sampling.temperature"),
    (text_request("hi", top_p=0.0), "sampling.top_p"),
    (text_request("hi", top_k=-2), "sampling.top_k"),
    (text_request("hi", min_p=1.5), "sampling.min_p"),
    (text_request("hi", min_p=-0.1), "sampling.min_p"),
    (text_request("hi", top_p=1.5), "sampling.top_p"),
    (text_request("hi", top_p=float("nan")), "sampling.top_p"),
    (text_request("hi", top_k=0), "sampling.top_k"),
    (text_request("hi", temperature=float("inf")), "sampling.temperature"),
    (text_request("hi", max_tokens=4, min_tokens=5), "sampling.min_tokens"),
    (text_request("hi", n=0), "sampling.n"),
    (text_request("hi", n=MAX_N + 1), "sampling.n"),
    (text_request("hi", logprobs=MAX_LOGPROBS + 1), "sampling.logprobs"),
    (text_request("hi", prompt_logprobs=MAX_LOGPROBS + 1), "sampling.prompt_logprobs"),
    (text_request("hi", presence_penalty=2.5), "sampling.presence_penalty"),
    (text_request("hi", frequency_penalty=float("nan")), "sampling.frequency_penalty"),
    (text_request("hi", repetition_penalty=0.0), "sampling.repetition_penalty"),
    (text_request("hi", repetition_penalty=-1.0), "sampling.repetition_penalty"),
    (text_request("hi", logit_bias={10**7: 1.0}), "sampling.logit_bias"),
    (text_request("hi", logit_bias={5: 1000.0}), "sampling.logit_bias"),
    (text_request("hi", stop_token_ids=[-1]), "sampling.stop_token_ids"),
    (text_request("hi", stop_token_ids=list(range(65))), "sampling.stop_token_ids"),
    (text_request("hi", stop=[""]), "sampling.stop"),
    (text_request("hi", stop=["x"] * (MAX_STOP_STRINGS + 1)), "sampling.stop"),
    (text_request("hi", stop=["x" * (MAX_STOP_STRING_CHARS + 1)]), "sampling.stop"),
    (text_request("hi", json_schema="{not json"), "sampling.json_schema"),
    (text_request("hi", json_schema='{"type": "no such type"}'), "sampling.json_schema"),
    (text_request("hi", json_schema="[1, 2]"), "sampling.json_schema"),
    (text_request("hi", json_schema='{"type": "object"}', min_tokens=2), "sampling.json_schema"),
    (text_request("hi", regex="[a-"), "sampling.regex"),
    (text_request("hi", choice=[]), "sampling.choice"),
    (text_request("hi", grammar="start: undefined_rule"), "sampling.grammar"),
    (text_request("hi", regex="a+", allowed_token_ids=[5]), "sampling.regex"),
    (text_request("hi", allowed_token_ids=[5, 10**7]), "sampling.allowed_token_ids"),
    (text_request("hi", truncate_prompt_tokens=0), "sampling.truncate_prompt_tokens"),
    (text_request("hi", bad_words=["  "]), "sampling.bad_words"),
    (text_request("hi", bad_words=["x"] * (MAX_BAD_WORDS + 1)), "sampling.bad_words"),
    (text_request("hi", bad_words=[" ".join(["antidisestablishment"] * 8)]), "sampling.bad_words"),
    (text_request("hi", bad_words_token_ids=[[5, 10**7]]), "sampling.bad_words_token_ids"),
    (text_request("hi", bad_words_token_ids=[[]]), "sampling.bad_words_token_ids"),
    (text_request("hi", regex="a+", bad_words=["b"]), "sampling.regex"),
])
def test_bad_input_is_invalid_argument_and_server_keeps_serving(services, request_, field):
    with pytest.raises(grpc.RpcError) as error:
        services.client.generate_samples(request_)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}:")
    result = services.client.generate(text_request("The capital of France is", max_tokens=4, temperature=0.0))
    assert len(result.token_ids) == 4


def test_deadline_exceeded_frees_blocks(services):
    before = services.wait_until_idle()
    with pytest.raises(grpc.RpcError) as error:
        request = text_request("Write a long essay.", max_tokens=2000, temperature=0.0, ignore_eos=True)
        services.client.generate(request, timeout=0.5)
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = services.wait_until_idle()
    assert after.num_free_blocks == before.num_free_blocks


def test_an_image_for_a_model_without_a_vision_tower_is_invalid_argument_naming_it(services):
    """Sent to the scheduler as a router sends images; the default model (SmolLM2) takes none."""
    assert not services.client.model_info().HasField("vision")
    ids, images = image_prompt(VisionTokens(IMAGE_TOKEN, VISION_START, VISION_END), TEXT, ["small"],
                               processed_images())
    result = served(services, [submit("image-for-text-model", ids, images)])["image-for-text-model"]
    assert result["status"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert result["message"] == "images[0]: the model takes no images (it has no vision tower)"
    load = services.wait_until_idle()
    assert load.num_free_blocks == load.num_total_blocks
