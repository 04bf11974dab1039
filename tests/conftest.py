import os
from pathlib import Path

import pytest


def model_dir() -> Path:
    from sluice.model_store import fetch_default_model

    cache = Path(os.environ.get("SLUICE_CACHE_DIR", Path.home() / ".cache" / "sluice"))
    return fetch_default_model(cache)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    return model_dir()
