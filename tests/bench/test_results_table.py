"""BENCHMARKS.md's results table is the one benchmarks/results_table.py writes from benchmarks/results/*.json, and a
`sluice bench --out` report becomes records that the table shows in place of older ones."""
import json
import re
import shlex
import subprocess
import sys

from tests.scripts import ROOT, load_script

BENCHMARKS = ROOT / "benchmarks"
results_table = load_script(BENCHMARKS / "results_table.py")
record_result = load_script(BENCHMARKS / "record_result.py")


def test_the_table_is_written_from_the_results():
    check = subprocess.run([sys.executable, str(BENCHMARKS / "results_table.py"), "--check"], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stderr


def test_every_record_is_complete_and_names_a_machine_of_the_page():
    machines = results_table.DOC.read_text().split("## Machines")[1].split("\n## ")[0]
    for path in sorted(results_table.RESULTS.glob("*.json")):
        for record in json.loads(path.read_text()):
            assert set(results_table.FIELDS) <= set(record), (path.name, record)
            assert isinstance(record["value"], int | float) and not isinstance(record["value"], bool), record
            assert re.fullmatch(r"[0-9a-f]{7,40}", record["commit"]), record
            assert f"\n| {record['device']} |" in machines, record


def test_a_bench_report_becomes_records_that_replace_older_ones():
    from sluice.cli.main import build_parser

    argv = ["bench", "throughput", "--model", "Qwen3-0.6B", "--load-format", "dummy", "--device", "cuda",
            "--kv-cache-dtype", "fp8", "--input-len", "10", "20", "--in-process"]
    workload = {k: v for k, v in vars(build_parser().parse_args([*argv, "--out", "tput.json"])).items() if k != "run"}
    report = json.loads(json.dumps({"workload": workload, "results": [
        {"name": "sluice (in process)", "output_tokens_per_s": 1234.6}]}, default=str))
    (record,) = record_result.records(report, "Qwen3-0.6B, a workload", "H200", "abcdef0")
    assert (record["metric"], record["value"], record["unit"]) == ("sluice (in process)", 1235, "output tok/s")
    assert shlex.split(record["command"])[0] == ".venv/bin/sluice"
    rebuilt = vars(build_parser().parse_args(shlex.split(record["command"])[1:]))
    assert rebuilt == vars(build_parser().parse_args(argv))  # the same flags, --out left out
    older = dict(record, value=1000, commit="1234567")
    (row,) = results_table.latest([older, record])
    assert row["commit"] == "abcdef0"
    assert "| Qwen3-0.6B, a workload | sluice (in process): 1,235 output tok/s | H200 | abcdef0 |  |" in \
        results_table.render([older, record])
