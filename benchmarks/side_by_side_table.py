"""The markdown table of benchmarks/vllm_side_by_side.sh's results, for BENCHMARKS.md: each row's Sluice figures (in
process and through gRPC) beside vLLM's, and their ratios.

  .venv/bin/python benchmarks/side_by_side_table.py RESULTS_DIR [RESULTS_DIR ...] [--commit C]
"""
import argparse
import json
import subprocess
from pathlib import Path

from record_result import MSPT, TOKS, figures

ENGINES = ("inproc", "grpc", "vllm")


def vllm_figure(result: dict) -> tuple[float, str]:
    if "ms_per_token" in result:
        return result["ms_per_token"], MSPT
    return round(result["output_tok_s"]), TOKS


def load(folders: list[Path]) -> tuple[dict[str, dict[str, tuple[float, str]]], list[dict]]:
    """({row: {engine: (value, unit)}}, the calls' host records)."""
    rows, hosts = {}, []
    for path in sorted(p for folder in folders for p in folder.glob("*.json")):
        data = json.loads(path.read_text())
        engine, _, row = path.stem.partition("_")
        if engine == "host":
            hosts.append(data)
        elif engine in ENGINES:
            rows.setdefault(row, {})[engine] = vllm_figure(data) if engine == "vllm" else figures(data)[0][1:]
    return rows, hosts


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:,}"


def _ratio(sluice: float | None, vllm: float | None) -> str:
    return "—" if sluice is None or vllm is None else f"{sluice / vllm:.2f}×"


def render(rows: dict[str, dict[str, tuple[float, str]]], hosts: list[dict], commit: str) -> str:
    loops = sorted(host["host_loop_s"] for host in hosts) or ["?"]
    gpus = " / ".join(sorted({host["gpu"] for host in hosts}))
    lines = [f"GPU: {gpus}; host loop: {loops[0]}–{loops[-1]} s; commit {commit}; vLLM 0.26.0 offline, its defaults "
             "but for the row's flags. Ratios are Sluice over vLLM: above 1 is ahead for output tok/s, below 1 for "
             "ms per output token (batch 1).", "",
             "| row | unit | Sluice in process | Sluice gRPC | vLLM | in process / vLLM | gRPC / vLLM |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row, by_engine in sorted(rows.items(), key=lambda item: (MSPT in _units(item[1]), item[0])):
        inproc, grpc, vllm = (by_engine.get(engine, (None,))[0] for engine in ENGINES)
        lines.append(f"| {row} | {' / '.join(sorted(_units(by_engine)))} | {_cell(inproc)} | {_cell(grpc)} | "
                     f"{_cell(vllm)} | {_ratio(inproc, vllm)} | {_ratio(grpc, vllm)} |")
    return "\n".join(lines)


def _units(by_engine: dict[str, tuple[float, str]]) -> set[str]:
    return {unit for _, unit in by_engine.values()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+", help="the $OUT folders of the calls")
    parser.add_argument("--commit", help="default: the checkout's")
    args = parser.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           check=True).stdout.strip()
    print(render(*load(args.folders), commit))


if __name__ == "__main__":
    main()
