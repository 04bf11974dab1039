"""Writes the results table of BENCHMARKS.md from benchmarks/results/*.json; with --check, fails where it differs."""
import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DOC = RESULTS.parent.parent / "BENCHMARKS.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
FIELDS = ("workload", "metric", "value", "unit", "device", "commit", "command")


def load(folder: Path = RESULTS) -> list[dict]:
    """Every record, file by file (sorted by name), each file's oldest first."""
    records = []
    for path in sorted(folder.glob("*.json")):
        for record in json.loads(path.read_text()):
            if missing := [name for name in FIELDS if name not in record]:
                raise SystemExit(f"{path}: a record lacks {', '.join(missing)}: {record}")
            records.append(record)
    return records


def latest(records: list[dict]) -> list[dict]:
    """The last record of each workload, metric and device, grouped by workload in order of first appearance."""
    rows = {(r["workload"], r["metric"], r["device"]): r for r in records}
    workloads = list(dict.fromkeys(r["workload"] for r in records))
    return sorted(rows.values(), key=lambda r: workloads.index(r["workload"]))


def figure(record: dict) -> str:
    unit = record["unit"]
    value = f"{record['value']:,}".replace("-", "−")
    text = f"{record['metric']}: {value}{'' if unit.startswith(('%', 'x')) else ' '}{unit}".rstrip()
    if "runs" in record:
        text += f" (mean of {len(record['runs'])})"
    return text + (f"; {record['note']}" if "note" in record else "")


def render(records: list[dict]) -> str:
    lines = ["<!-- written by benchmarks/results_table.py from benchmarks/results/*.json; do not edit -->", "",
             "| workload | figure | device | commit | target |", "| --- | --- | --- | --- | --- |"]
    previous = None
    for r in latest(records):
        workload, previous = ("" if r["workload"] == previous else r["workload"]), r["workload"]
        lines.append(f"| {workload} | {figure(r)} | {r['device']} | {r['commit']} | {r.get('target', '')} |")
    return "\n" + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md's table differs; write nothing")
    args = parser.parse_args()
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    table = render(load())
    if args.check:
        if text[start:end] != table:
            sys.exit("BENCHMARKS.md's results table differs from benchmarks/results/*.json: "
                     "run .venv/bin/python benchmarks/results_table.py")
    else:
        DOC.write_text(text[:start] + table + text[end:])


if __name__ == "__main__":
    main()
