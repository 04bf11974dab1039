"""The sampling controls of a benchmark's requests: greedy by default (the standard workload), or any realistic mix."""
from dataclasses import replace

from sluice.cli.bench.workload import BenchRequest
from sluice.core.sampling_params import SamplingParams


def add_sampling_options(parser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--logprobs", type=int, help="the sampled token's logprob and this many alternatives")


def with_sampling(requests: list[BenchRequest], args) -> list[BenchRequest]:
    """The requests with the controls given and ignore_eos; when they sample, request i is seeded with --seed + i,
    so that a rerun draws the same tokens."""
    controls = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty, frequency_penalty=args.frequency_penalty,
                              presence_penalty=args.presence_penalty, logprobs=args.logprobs, ignore_eos=True)
    if controls.greedy:
        return [replace(request, sampling=controls) for request in requests]
    return [replace(request, sampling=replace(controls, seed=args.seed + i)) for i, request in enumerate(requests)]
