"""Measures the CPU cost of the ngram proposer for one step: a proposal for each of N running requests whose contexts
(prompt + output) are L tokens long, each grown by a few accepted tokens per step as in a speculative step.
Run: python benchmarks/ngram_proposer.py [--num-requests 256 --context-len 2048]"""
import argparse
import random
import statistics
import time

from sluice.core.sampling_params import SamplingParams
from sluice.scheduler.request import Request
from sluice.scheduler.speculation.ngram_proposer import NgramProposer


def bench(num_requests: int, context_len: int, num_steps: int, num_tokens: int, ngram_min: int,
          ngram_max: int) -> dict[str, float]:
    rng = random.Random(0)
    proposer = NgramProposer(ngram_min, ngram_max)
    requests = []
    for i in range(num_requests):  # a vocabulary of 32k tokens, no accidental repeats: the lookup's worst case
        prompt = [rng.randrange(1, 32000) for _ in range(context_len)]
        requests.append(Request(f"req-{i}", prompt, SamplingParams(max_tokens=num_steps * 4 + 1)))
    for request in requests:
        proposer.propose(request, num_tokens)  # the prompt is packed once, when the request first decodes
    step_us, num_proposed = [], 0
    for _ in range(num_steps):
        for request in requests:
            for _ in range(rng.randrange(1, num_tokens + 2)):
                request.append_output_token(rng.randrange(1, 32000))
        start = time.perf_counter()
        for request in requests:
            num_proposed += len(proposer.propose(request, num_tokens))
        step_us.append((time.perf_counter() - start) * 1e6)
    return {"step_median_us": statistics.median(step_us), "step_p99_us": statistics.quantiles(step_us, n=100)[98],
            "proposals_per_request_step": num_proposed / (num_steps * num_requests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--context-len", type=int, default=2048)
    parser.add_argument("--num-steps", type=int, default=200)
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--ngram-max", type=int, default=4)
    args = parser.parse_args()
    result = bench(args.num_requests, args.context_len, args.num_steps, args.num_speculative_tokens, args.ngram_min,
                   args.ngram_max)
    print(f"{args.num_requests} requests of {args.context_len} tokens, {args.num_steps} steps: "
          + ", ".join(f"{key} {value:.2f}" for key, value in result.items()))


if __name__ == "__main__":
    main()
