import json

import pytest

from tests.loadtest.test_ghz_configs import CONFIGS, load_requests


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_ghz_request_data_generates_through_the_router(services, path):
    for request in load_requests(json.loads(path.read_text())):
        request.sampling.max_tokens = 4
        result = services.client.generate(request)
        assert result.finish_reason in ("stop", "length")
