"""Two whole Sluice stacks behind one real smg with the cache_aware policy, which subscribes to each router's KV
events: a request lands on the replica whose prefix cache holds its prompt's head, though smg never routed the
request that cached it (it went to that replica's own router)."""
import openai
import pytest

from sluice.cli.gateway import GatewayLayout, start_gateway, wait_until_gateway_serves
from sluice.cli.launcher import free_ports, stop_services
from sluice.client import text_request
from tests.e2e.services import running_services

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
BLOCK = 16


@pytest.fixture(scope="module")
def replicas(services, default_model_dir):
    """The session's stack and one more."""
    with running_services(default_model_dir) as second:
        yield services, second


@pytest.fixture(scope="module")
def client(replicas, default_model_dir):
    layout = GatewayLayout("127.0.0.1", *free_ports(2))
    routers = [replica.layout.router_address for replica in replicas]
    process = start_gateway(layout, routers, default_model_dir, ["--policy", "cache_aware"])
    try:
        wait_until_gateway_serves(layout, 60, process)
        with openai.OpenAI(base_url=f"{layout.url}/v1", api_key="unused", max_retries=0) as client:
            yield client
    finally:
        stop_services([process])


def _document(topic: str) -> str:
    return " ".join(f"Note {i} on {topic}: the {topic} ledger lists entry {i * 7} as settled." for i in range(12))


def test_a_shared_prefix_lands_on_the_replica_that_cached_it(replicas, client):
    documents = [_document("harbour"), _document("orchard")]
    for replica, document in zip(replicas, documents):  # each replica caches its document, out of smg's sight
        warmed = replica.client.generate(text_request(document, max_tokens=1))
        assert warmed.usage["cached_tokens"] == 0
    hit_rates = [replica.load().prefix_cache_hit_rate for replica in replicas]
    for question in ("Which entry is settled?", "Who keeps the ledger?"):
        for document in documents:
            usage = client.completions.create(model=MODEL, prompt=f"{document} {question}", max_tokens=2).usage
            assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens // BLOCK * BLOCK - 2 * BLOCK
    for replica, before in zip(replicas, hit_rates):
        assert replica.load().prefix_cache_hit_rate > before  # both replicas served their own document's requests
