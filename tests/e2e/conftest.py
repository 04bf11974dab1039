import pytest

from tests.e2e.services import running_services


@pytest.fixture(scope="session")
def services(default_model_dir):
    with running_services(default_model_dir) as running:
        yield running
