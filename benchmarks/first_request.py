"""What the first request of each sampling variant pays on a new stack: `sluice serve` starts with an empty compile
cache (--compile-cache in a new folder) and gets one request of each variant, one after the other, each timed to its
first token (TTFT); then a second stack starts on the same cache, now warm, and gets the same requests. Prints each
variant's TTFT on both and their ratio, each stack's start-up (until it serves) and the worker's sampler warm-up
within it (sluice:worker_warm_up_seconds), and the warm-up's share of the rest of the start-up.
Run from the repository root, on the CPU with the default model:
  .venv/bin/python benchmarks/first_request.py
on a GPU, with `sluice serve` flags after the benchmark's own:
  .venv/bin/python benchmarks/first_request.py --device cuda --load-format dummy --model Qwen3-0.6B"""
import argparse
import re
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sluice.cli.launcher import free_ports
from sluice.cli.main import build_parser
from sluice.cli.python_command import sluice_command
from sluice.client import SluiceClient, sampling_params
from sluice.v1 import generation_pb2 as pb

PROMPT = [1 + (i * 7919) % 1000 for i in range(64)]  # token ids, so that a model without a tokenizer takes them
VARIANTS = {
    "greedy": {},
    "temperature": {"temperature": 0.8},
    "top-k + top-p": {"temperature": 0.8, "top_k": 50, "top_p": 0.95},
    "top-p over the vocabulary": {"temperature": 0.8, "top_p": 0.95},
    "min-p, seeded": {"temperature": 0.8, "min_p": 0.05, "seed": 7},
    "penalties + logprobs": {"repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": 0.5,
                             "logprobs": 5},
    "prompt logprobs": {"prompt_logprobs": 3},
    "logit bias + bad words": {"logit_bias": {5: 2.0}, "bad_words_token_ids": [[7], [8, 9]]},
    "allowed tokens, min tokens": {"allowed_token_ids": list(range(10, 500)), "min_tokens": 2},
}
STRUCTURED = {"structured output": {"choice": ["yes", "no"]}}  # needs the model's tokenizer: not with dummy weights
WARM_UP_METRIC = re.compile(r"^sluice:worker_warm_up_seconds\{[^}]*\} (\S+)$", re.MULTILINE)
WORKER_METRICS_OFFSET = 2  # `sluice serve` gives the router the metrics port, the scheduler the next, then the worker


@dataclass(slots=True)
class StackRun:
    start_up_seconds: float
    warm_up_seconds: float
    ttft_ms: dict[str, float]


def run_stack(serve_flags: list[str], compile_cache: Path, variants: dict[str, dict], max_tokens: int,
              timeout: float) -> StackRun:
    port, metrics_port = free_ports(2, run=WORKER_METRICS_OFFSET + 8)
    command = [*sluice_command("serve"), "--port", str(port), "--metrics-port", str(metrics_port),
               "--compile-cache", str(compile_cache), *serve_flags]
    started = time.perf_counter()
    stack = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_until_serving(stack, timeout)
        start_up = time.perf_counter() - started
        warm_up = _warm_up_seconds(metrics_port + WORKER_METRICS_OFFSET)
        with SluiceClient(f"127.0.0.1:{port}") as client:
            ttft = {name: _ttft_ms(client, params, max_tokens) for name, params in variants.items()}
        return StackRun(start_up, warm_up, ttft)
    finally:
        stack.send_signal(signal.SIGTERM)
        stack.wait(timeout=120)


def _wait_until_serving(stack: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for line in stack.stdout:
        if line.startswith("sluice is serving"):
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"the stack did not serve within {timeout} s (exit code {stack.poll()})")


def _warm_up_seconds(worker_metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{worker_metrics_port}/metrics", timeout=10) as response:
        return float(WARM_UP_METRIC.search(response.read().decode()).group(1))


def _ttft_ms(client: SluiceClient, params: dict, max_tokens: int) -> float:
    request = pb.GenerateRequest(tokens=pb.TokenIds(ids=PROMPT), return_token_ids=True,
                                 sampling=sampling_params(max_tokens=max_tokens, ignore_eos=True, **params))
    started = time.perf_counter()
    for response in client.stream(request, timeout=600):
        if response.WhichOneof("kind") == "chunk" and response.chunk.token_ids:
            return (time.perf_counter() - started) * 1000
    raise RuntimeError(f"no token came for {params}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    args, serve_flags = parser.parse_known_args()
    variants = dict(VARIANTS)
    if build_parser().parse_args(["serve", *serve_flags]).load_format != "dummy":
        variants |= STRUCTURED
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "compile-cache"
        cold, warm = (run_stack(serve_flags, cache, variants, args.max_tokens, args.startup_timeout)
                      for _ in range(2))
    print(f"{'first request of':28} {'cold cache':>14} {'warm cache':>14} {'ratio':>7}")
    for name in variants:
        print(f"{name:28} {cold.ttft_ms[name]:11.1f} ms {warm.ttft_ms[name]:11.1f} ms "
              f"{cold.ttft_ms[name] / warm.ttft_ms[name]:7.2f}")
    for name, run in (("cold", cold), ("warm", warm)):
        rest = run.start_up_seconds - run.warm_up_seconds
        print(f"start-up, {name} cache: {run.start_up_seconds:.2f} s, of which the sampler warm-up "
              f"{run.warm_up_seconds:.2f} s: {100 * run.warm_up_seconds / rest:.1f}% on top of the "
              f"{rest:.2f} s without it")


if __name__ == "__main__":
    main()
