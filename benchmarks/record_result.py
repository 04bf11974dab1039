"""Appends the figures of a `sluice bench throughput|latency|serve --out REPORT.json` report to a results file."""
import argparse
import datetime
import json
import shlex
import subprocess
from pathlib import Path

TOKS, MSPT = "output tok/s", "ms per output token"


def figures(report: dict) -> list[tuple[str, float, str]]:
    """(metric, value, unit) of each figure the report's benchmark is read for."""
    bench = report["workload"]["bench"]
    if bench == "throughput":
        return [(r["name"], round(r["output_tokens_per_s"]), TOKS) for r in report["results"]]
    if bench == "latency":
        return [(r["name"], round(r["ms_per_token"], 3), MSPT) for r in report["results"]]
    summary = report["summary"]
    return [(f"{name} {point}", round(summary[f"{name.lower()}_ms"][point], digits), "ms")
            for name, digits in (("TTFT", 1), ("ITL", 2)) for point in ("p50", "p99")]


def command(workload: dict) -> str:
    """The `sluice bench` command line that differs from the defaults as the report's run did (--out left out)."""
    from sluice.cli.main import build_parser

    parser = _subcommand(_subcommand(build_parser(), "bench"), workload["bench"])
    words = [".venv/bin/sluice", "bench", workload["bench"]]
    for action in parser._actions:
        value = workload.get(action.dest)
        if not action.option_strings or action.dest in ("help", "out") or value in (None, action.default) \
                or isinstance(value, list) and tuple(value) == tuple(action.default or ()):
            continue
        words.append(action.option_strings[-1])
        if action.nargs != 0:
            words += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return shlex.join(words)


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def records(report: dict, workload: str, device: str, commit: str, command_line: str | None = None) -> list[dict]:
    line = command_line or command(report["workload"])
    return [{"workload": workload, "metric": metric, "value": value, "unit": unit, "device": device,
             "commit": commit, "command": line, "date": datetime.date.today().isoformat()}
            for metric, value, unit in figures(report)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("report", type=Path, help="the JSON that `sluice bench ... --out` wrote")
    parser.add_argument("--to", type=Path, required=True, help="e.g. benchmarks/results/qwen3-0.6b.json")
    parser.add_argument("--workload", required=True, help="its name in the table, as earlier runs of it name it")
    parser.add_argument("--device", required=True, help='e.g. "H200", "H100 80GB HBM3", "CPU, 2 cores"')
    parser.add_argument("--commit", help="default: the checkout's")
    parser.add_argument("--command", help="default: the `sluice bench` command line the report was written by")
    args = parser.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           check=True).stdout.strip()
    existing = json.loads(args.to.read_text()) if args.to.exists() else []
    added = records(json.loads(args.report.read_text()), args.workload, args.device, commit, args.command)
    args.to.write_text(json.dumps(existing + added, indent=2, ensure_ascii=False) + "\n")
    print(f"{len(added)} records appended to {args.to}; now run .venv/bin/python benchmarks/results_table.py")


if __name__ == "__main__":
    main()
