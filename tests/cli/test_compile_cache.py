"""--compile-cache: `sluice serve` hands it to the worker it starts, which points Triton's and torch inductor's caches
into it."""
import os

import pytest
import triton
from torch._inductor.runtime.cache_dir_utils import cache_dir

from sluice.cli.compile_cache import CACHES, use_compile_cache
from sluice.cli.main import build_parser
from sluice.cli.service_flags import worker_flags


@pytest.fixture
def environment(monkeypatch):
    for variable in CACHES:
        monkeypatch.setenv(variable, "")  # restored after the test, whatever use_compile_cache sets
    return os.environ


def test_the_folder_holds_both_caches(environment, tmp_path):
    use_compile_cache(str(tmp_path))
    assert triton.knobs.cache.dir == str(tmp_path / "triton")
    assert cache_dir() == str(tmp_path / "inductor")


def test_no_folder_leaves_the_caches_alone(environment):
    use_compile_cache("")
    assert [environment[variable] for variable in CACHES] == ["", ""]


def test_serve_passes_the_folder_to_the_worker():
    args = build_parser().parse_args(["serve", "--compile-cache", "/var/cache/sluice"])
    flags = worker_flags(args)
    assert flags[flags.index("--compile-cache") + 1] == "/var/cache/sluice"
