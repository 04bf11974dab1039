"""The benchmarks' requests written to a file and read back, and nano-vllm's bench workload."""
from sluice.cli.bench.workload import (BenchRequest, length_ranges, nano_vllm_workload, random_workload, read_workload,
                                       write_workload)


def test_a_written_workload_reads_back_the_same_requests(tmp_path):
    requests = random_workload(5, (3, 9), (2, 7), 1000, seed=3)
    write_workload(tmp_path / "w.json", requests)
    assert read_workload(tmp_path / "w.json") == requests


def test_length_ranges_are_the_smallest_and_largest_lengths():
    requests = [BenchRequest([1, 2, 3], 5), BenchRequest([4], 2), BenchRequest([5, 6], 9)]
    assert length_ranges(requests) == ([1, 3], [2, 9])


def test_nano_vllm_workload_draws_its_token_ids_below_10001_in_its_length_ranges():
    requests = nano_vllm_workload(256, (100, 1024), (100, 1024))
    assert requests == nano_vllm_workload(256, (100, 1024), (100, 1024))
    assert all(0 <= token <= 10000 for r in requests for token in r.prompt_token_ids)
    assert all(100 <= len(r.prompt_token_ids) <= 1024 and 100 <= r.max_tokens <= 1024 for r in requests)
    assert requests != random_workload(256, (100, 1024), (100, 1024), 10001)
