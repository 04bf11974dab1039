import argparse

from sluice.cli.bench.sampling_flags import add_sampling_options, with_sampling
from sluice.cli.bench.workload import random_workload


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    add_sampling_options(parser)
    return parser.parse_args(flags)


def test_the_default_workload_is_greedy_and_unseeded():
    for request in with_sampling(random_workload(3, (4, 8), (2, 5), 100), _args()):
        params = request.sampling_params()
        assert params.greedy and params.ignore_eos and params.seed is None
        assert params.max_tokens == request.max_tokens


def test_sampled_requests_carry_every_control_and_a_seed_each():
    args = _args("--seed", "7", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "50", "--min-p", "0.05",
                 "--repetition-penalty", "1.1", "--frequency-penalty", "0.2", "--presence-penalty", "0.3",
                 "--logprobs", "5")
    requests = with_sampling(random_workload(3, (4, 8), (2, 5), 100), args)
    assert [r.sampling_params().seed for r in requests] == [7, 8, 9]
    params = requests[0].sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 50, 0.05)
    assert (params.repetition_penalty, params.frequency_penalty, params.presence_penalty) == (1.1, 0.2, 0.3)
    assert params.logprobs == 5 and params.ignore_eos and params.max_tokens == requests[0].max_tokens
