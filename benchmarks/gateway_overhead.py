"""The OpenAI gateway's overhead: the same `sluice bench serve` workload against the router's native API and through
smg in front of it (`sluice serve --openai-port`), alternating, in one run:
`python benchmarks/gateway_overhead.py --address 127.0.0.1:50051 --openai-url http://127.0.0.1:8000 --rounds 3
--tokenizer-json MODEL/tokenizer.json [workload flags of sluice bench serve]`. Runs one warm-up round of each,
then prints each round and the mean TTFT and inter-token gap of each front over all rounds and their difference:
the overhead per request and per token."""
import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from sluice.cli.python_command import sluice_command


def _bench(front: list[str], workload: list[str], out: Path) -> dict:
    subprocess.run([*sluice_command(), "bench", "serve", *front, *workload, "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="127.0.0.1:50051")
    parser.add_argument("--openai-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokenizer-json", required=True, help="the model's, so both fronts get the same prompts")
    args, workload = parser.parse_known_args()
    workload += ["--text-prompts", args.tokenizer_json]
    fronts = {"native": ["--address", args.address],
              "smg": ["--openai-url", args.openai_url, "--model", args.model]}
    ttfts = {name: [] for name in fronts}
    itls = {name: [] for name in fronts}
    with tempfile.TemporaryDirectory() as folder:
        for name, front in fronts.items():  # a warm-up round, not counted: the first prefill shapes are slow
            _bench(front, workload, Path(folder) / f"{name}-warmup.json")
        for round_number in range(args.rounds):
            for name, front in fronts.items():
                result = _bench(front, workload, Path(folder) / f"{name}-{round_number}.json")
                ttfts[name] += [request["ttft"] for request in result["requests"]]
                itls[name] += [gap for request in result["requests"] for gap in request["itls"]]
                summary = result["summary"]
                print(f"round {round_number + 1} {name:6}: {summary['output_tokens_per_s']:.1f} output tokens/s, "
                      f"TTFT p50 {summary['ttft_ms']['p50']:.1f} ms, ITL p50 {summary['itl_ms']['p50']:.2f} ms",
                      flush=True)
    ttft = {name: statistics.fmean(values) * 1000 for name, values in ttfts.items()}
    itl = {name: statistics.fmean(values) * 1000 for name, values in itls.items()}
    for name in fronts:
        print(f"{name:6}: mean TTFT {ttft[name]:.2f} ms over {len(ttfts[name])} requests, mean inter-token gap "
              f"{itl[name]:.3f} ms over {len(itls[name])} gaps")
    print(f"overhead per request (TTFT): {ttft['smg'] - ttft['native']:+.2f} ms; per token (inter-token gap): "
          f"{itl['smg'] - itl['native']:+.3f} ms")


if __name__ == "__main__":
    main()
