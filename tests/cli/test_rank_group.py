"""Which ranks `sluice worker` runs on this machine: every rank of the replica, or with --pp-rank one stage's."""
import pytest

from sluice.cli.main import build_parser
from sluice.cli.rank_group import group_ranks


def _ranks(*flags: str) -> range:
    return group_ranks(build_parser().parse_args(["worker", "-tp", "2", "-pp", "3", *flags]))


def test_the_replica_or_one_stage_runs_here():
    assert _ranks() == range(6)
    assert _ranks("--pp-rank", "1", "--dist-init-address", "host-a:29500") == range(2, 4)


@pytest.mark.parametrize("flags, message", [
    (("--pp-rank", "3", "--dist-init-address", "host-a:29500"), r"--pp-rank must be in \[0, 3\), got 3"),
    (("--pp-rank", "0"), "--pp-rank needs --dist-init-address"),
])
def test_a_stage_outside_the_replica_or_without_a_meeting_address_is_refused(flags, message):
    with pytest.raises(SystemExit, match=message):
        _ranks(*flags)
