"""Measures the host cost of one decode step's logprobs on their way out: the worker packing them from its host
tensors into the StepResult, the scheduler reading that and packing its StepUpdate for the router, the router
unpacking each sample's. Run: python benchmarks/logprob_messages.py [--num-requests 256] [--num-top 5]"""
import argparse
import statistics
import time

import torch

from sluice.core.logprobs_pb import logprob_rows_from_pb
from sluice.core.step_plan import StepOutcome
from sluice.core.step_plan_pb import outcome_from_pb, outcome_to_pb
from sluice.scheduler.outputs import RequestUpdate
from sluice.scheduler.routers.updates_pb import step_update_to_pb
from sluice.v1 import scheduler_pb2, worker_pb2
from sluice.worker.sampling.token_logprobs import LogprobTensors

VOCAB = 151_936


def _median_us(stage, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        stage()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def bench(num_requests: int, num_top: int, repeats: int) -> dict[str, float]:
    request_ids = [f"req-{i}" for i in range(num_requests)]
    tensors = LogprobTensors([(request_id, 1, num_top) for request_id in request_ids],
                             torch.randint(VOCAB, (num_requests,)), -torch.rand(num_requests),
                             torch.randint(1, 100, (num_requests,)), torch.randint(VOCAB, (num_requests, num_top)),
                             -torch.rand(num_requests, num_top))
    sampled = dict(zip(request_ids, tensors.token_ids.tolist()))

    def worker() -> bytes:
        return outcome_to_pb(StepOutcome(1, sampled, tensors.rows())).SerializeToString()

    result = worker()

    def scheduler() -> bytes:
        message = worker_pb2.StepResult.FromString(result)
        logprobs = outcome_from_pb(message).logprobs.by_request()
        updates = [RequestUpdate(request_id, [token], None, 0, 0, 0, logprobs=logprobs[request_id])
                   for request_id, token in sampled.items()]
        return step_update_to_pb(updates).SerializeToString()

    update = scheduler()

    def router() -> int:
        return len(logprob_rows_from_pb(scheduler_pb2.StepUpdate.FromString(update).logprobs).unpacked())

    assert router() == num_requests
    return {"worker_us": _median_us(worker, repeats), "scheduler_us": _median_us(scheduler, repeats),
            "router_us": _median_us(router, repeats), "step_result_bytes": len(result)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--num-top", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    figures = bench(args.num_requests, args.num_top, args.repeats)
    print(" ".join(f"{name}={value:.0f}" for name, value in figures.items()))


if __name__ == "__main__":
    main()
