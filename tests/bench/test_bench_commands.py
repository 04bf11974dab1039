"""`sluice bench` run for real on the default model: the in-process engine, the full gRPC stack (three service
processes) and the Hugging Face baseline, each on the same tiny workload; JSON reports checked against the workload."""
import json
import os
import subprocess

import pytest

from sluice.cli.bench.hf_baseline import output_len
from sluice.cli.bench.workload import random_workload, read_workload
from sluice.cli.python_command import sluice_command

WORKLOAD = ["--num-requests", "4", "--input-len", "8", "16", "--output-len", "3", "6"]


def _bench(tmp_path, *args: str) -> dict:
    out = tmp_path / "bench.json"
    subprocess.run([*sluice_command(), "--log-level", "WARNING", "bench", *args, *WORKLOAD,
                    "--out", str(out)], check=True, timeout=600)
    return json.loads(out.read_text())


def _output_tokens(result: dict) -> float:
    return result["output_tokens_per_s"] * result["duration_s"]


SAMPLED = ["--temperature", "0.8", "--top-p", "0.95", "--top-k", "50", "--repetition-penalty", "1.1",
           "--frequency-penalty", "0.2", "--logprobs", "5"]


@pytest.mark.parametrize("mode", [["--in-process", "--baseline", "hf"], [], SAMPLED, ["--client-processes", "2"]],
                         ids=["in-process+hf", "grpc", "grpc-sampled", "grpc-two-client-processes"])
def test_throughput_reports_every_requested_token(tmp_path, default_model_dir, mode):
    report = _bench(tmp_path, "throughput", *mode)
    workload = random_workload(4, (8, 16), (3, 6), 49152)
    sluice, *baselines = report["results"]
    assert sluice["name"] == ("sluice (in process)" if "--in-process" in mode else "sluice (gRPC stack)")
    assert sluice["requests"] == 4
    assert _output_tokens(sluice) == pytest.approx(sum(r.max_tokens for r in workload))  # ignore_eos: every token
    assert [b["name"] for b in baselines] == (
        ["hf generate (static batches)", "hf generate_batch (continuous)"] if "--baseline" in mode else [])
    for baseline in baselines:  # HF generates the workload's mean output length for every request
        assert baseline["output_tokens"] == output_len(workload) * 4
        assert baseline["sluice_speedup"] == pytest.approx(
            sluice["output_tokens_per_s"] / baseline["output_tokens_per_s"])


def test_latency_in_process_times_tokens_after_the_first(tmp_path, default_model_dir):
    report = _bench(tmp_path, "latency", "--in-process")
    (result,) = report["results"]
    assert 0 < result["ms_per_token"] < 10_000


def test_latency_through_grpc_reports_each_process_cpu(tmp_path, default_model_dir):
    report = _bench(tmp_path, "latency")
    (result,) = report["results"]
    assert 0 < result["ms_per_token"] < 10_000
    cpu = result["busy_cores"]
    assert set(cpu) == {"worker", "scheduler", "router", "client"}
    # CPU times count in clock ticks, a process's and each thread's rounded apart: a process that idles may read 0,
    # and its busiest thread up to a tick at each end above it
    rounding = 2 / os.sysconf("SC_CLK_TCK") / result["duration_s"]
    for name, busy in cpu.items():
        assert 0 <= busy["busiest_thread_cores"] <= busy["cores"] + rounding, name
        assert busy["busiest_thread_cores"] <= 1.1, name  # one thread keeps at most one core busy
    assert cpu["worker"]["cores"] > cpu["scheduler"]["cores"]  # on the CPU the worker computes the model


def test_throughput_runs_the_requests_of_a_workload_file(tmp_path, default_model_dir):
    path = tmp_path / "workload.json"
    subprocess.run([*sluice_command(), "bench", "write-workload", str(path), "--num-requests", "3", "--input-len", "5",
                    "12", "--output-len", "2", "4", "--vocab-size", "49152", "--seed", "7"], check=True, timeout=60)
    requests = read_workload(path)
    assert requests == random_workload(3, (5, 12), (2, 4), 49152, seed=7)
    report = _bench(tmp_path, "throughput", "--in-process", "--workload", str(path))
    (result,) = report["results"]
    assert report["workload"]["num_requests"] == result["requests"] == 3
    output_tokens = _output_tokens(result)
    assert output_tokens == pytest.approx(sum(r.max_tokens for r in requests))
    assert result["total_tokens_per_s"] * result["duration_s"] - output_tokens == pytest.approx(
        sum(len(r.prompt_token_ids) for r in requests))
