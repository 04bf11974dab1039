"""A second request with the id of one in flight is refused; the first goes on as if it had not come."""
import grpc
import pytest

from sluice.client import SluiceClient, text_request
from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import extra_router

pytestmark = pytest.mark.slow

PROMPT = "Write a long story about a lighthouse keeper."
MAX_TOKENS = 32


def _request(request_id: str):
    request = text_request(PROMPT, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    request.request_id = request_id
    request.return_token_ids = True
    return request


def _refuses_then_finishes(first_client: SluiceClient, second_client: SluiceClient, request_id: str) -> list[int]:
    """Starts a request, sends a second one with its id once the first streams, and returns the first's tokens."""
    first = first_client.stream(_request(request_id), timeout=60)
    token_ids = list(next(first).chunk.token_ids)
    with pytest.raises(grpc.RpcError) as error:
        second_client.generate(_request(request_id), timeout=60)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("request_id:")
    responses = list(first)
    for response in responses[:-1]:
        token_ids += response.chunk.token_ids
    assert responses[-1].complete.finish_reason == pb.FINISH_REASON_LENGTH
    return token_ids


def test_a_duplicate_id_on_one_router_leaves_the_first_request_whole(services):
    expected = services.client.generate(_request("reference-one-router")).token_ids
    assert _refuses_then_finishes(services.client, services.client, "twice-on-one-router") == expected


def test_a_duplicate_id_from_another_router_leaves_the_first_request_whole(services, default_model_dir):
    expected = services.client.generate(_request("reference-two-routers")).token_ids
    with extra_router(services, default_model_dir) as (_, address), SluiceClient(address) as other:
        assert _refuses_then_finishes(services.client, other, "twice-on-two-routers") == expected
