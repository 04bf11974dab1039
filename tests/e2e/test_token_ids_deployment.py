"""A random-weight deployment of a named shape: no tokenizer, token ids in and out (bad words as token ids), text
controls refused."""
import grpc
import pytest

from sluice.client import text_request
from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import running_services


def _tokens(**sampling) -> pb.GenerateRequest:
    params = pb.SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, **sampling)
    return pb.GenerateRequest(tokens=pb.TokenIds(ids=[5, 17, 99, 3]), sampling=params)


def test_dummy_shape_serves_token_ids_and_refuses_text_controls():
    with running_services("SmolLM2-135M", worker_args=["--load-format", "dummy"],
                          router_args=["--no-tokenizer"]) as services:
        assert services.client.model_info().vocab_size == 49152
        first, second = services.client.generate(_tokens()), services.client.generate(_tokens())
        assert len(first.token_ids) == 8 and first.token_ids == second.token_ids and first.text == ""
        banned = services.client.generate(_tokens(bad_words_token_ids=[pb.TokenIds(ids=first.token_ids[:1])]))
        assert first.token_ids[0] not in banned.token_ids
        for request, field in [(text_request("hi", max_tokens=4), "text"),
                               (_tokens(stop=["."]), "sampling.stop"),
                               (_tokens(regex="[a-z]+"), "sampling.regex"),
                               (_tokens(bad_words=["x"]), "sampling.bad_words")]:
            with pytest.raises(grpc.RpcError) as error:
                services.client.generate(request)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert error.value.details().startswith(f"{field}:")
