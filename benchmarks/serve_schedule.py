"""How the token budget and the steps in flight trade first-token latency against inter-token latency, without a
device: the real Scheduler and PipelineDepth under Poisson arrivals, in simulated time, over a device whose step time
is modelled as base + per decode row + per prefill token. The defaults fit Llama-3.1-8B in bf16 on an H200 behind
`sluice serve` (16 req/s of 1,024 in / 256 out; BENCHMARKS.md, "Piecewise CUDA graphs"): at a 512-token budget it
measured TTFT p50 / p90 / p99 71.9 / 121.4 / 185.6 ms and ITL p99 17.4 ms; this model, with three steps in flight as
then, gives 69.8 / 121.9 / 184.1 and 16.8 ms.
Run from the repository root: .venv/bin/python benchmarks/serve_schedule.py [--budget 512 8192]
[--steps-in-flight 2 3 auto]"""
import argparse
import random
from collections import deque

from sluice.cli.bench.report import RequestTrace, format_summary, summarize
from sluice.core.sampling_params import SamplingParams
from sluice.core.step_plan import StepOutcome, StepPlan
from sluice.scheduler.config import SchedulerConfig
from sluice.scheduler.pipeline_depth import PipelineDepth
from sluice.scheduler.request import Request
from sluice.scheduler.scheduler import Scheduler


class DeviceModel:
    def __init__(self, base_ms: float, decode_row_ms: float, prefill_token_ms: float):
        self.base_ms, self.decode_row_ms, self.prefill_token_ms = base_ms, decode_row_ms, prefill_token_ms

    def step_seconds(self, plan: StepPlan) -> float:
        counts = plan.num_scheduled_tokens.values()
        decodes = sum(1 for count in counts if count == 1)
        prefill_tokens = sum(count for count in counts if count > 1)
        return (self.base_ms + self.decode_row_ms * decodes + self.prefill_token_ms * prefill_tokens) / 1000


def simulate(args: argparse.Namespace, budget: int, steps_in_flight: str) -> tuple[list[RequestTrace], float]:
    """The engine loop's order of events: fill the pipeline, then apply the oldest step's outcome when the device
    finishes it; a request that arrives meanwhile waits for the next plan. Tokens reach the client `--delivery-ms`
    after their step."""
    rng = random.Random(args.seed)
    arrivals, clock = [], 0.0
    for _ in range(args.num_requests):
        arrivals.append(clock)
        clock += rng.expovariate(args.rate)
    config = SchedulerConfig(num_blocks=args.num_requests * (args.input_len + args.output_len) // 16 + 1,
                             max_num_batched_tokens=budget, max_model_len=args.input_len + args.output_len)
    scheduler = Scheduler(config, eos_token_ids={0})
    device = DeviceModel(args.base_ms, args.decode_row_ms, args.prefill_token_ms)
    depth = PipelineDepth()
    limit = (lambda: depth.limit) if steps_in_flight == "auto" else (lambda: int(steps_in_flight))
    traces: dict[str, RequestTrace] = {}
    in_flight: deque[tuple[StepPlan, float]] = deque()
    now = device_free = 0.0
    host_seconds = args.host_ms / 1000
    while arrivals or in_flight or scheduler.has_unfinished_requests():
        while len(in_flight) < limit() and not (plan := scheduler.schedule()).is_empty:
            depth.plan_sent(now + host_seconds)
            device_free = max(now + host_seconds, device_free) + device.step_seconds(plan)
            in_flight.append((plan, device_free))
        if not in_flight:
            depth.idled()
        if arrivals and (not in_flight or arrivals[0] <= in_flight[0][1]):
            now = max(now, arrivals.pop(0))
            request_id = f"r{len(traces)}"
            prompt = [1 + (len(traces) * 7919 + j) % 30000 for j in range(args.input_len)]
            traces[request_id] = RequestTrace(now, args.input_len)
            scheduler.add_request(Request(request_id, prompt, SamplingParams(max_tokens=args.output_len,
                                                                             ignore_eos=True), arrival_time=now))
            continue
        plan, now = in_flight.popleft()
        depth.outcome_received(now)
        chunk_starts = {r.request_id: r.num_computed_tokens for r in (*plan.new_requests, *plan.cached_requests)}
        sampled = {request_id: 7 for request_id, count in plan.num_scheduled_tokens.items()
                   if chunk_starts[request_id] + count >= args.input_len}
        for update in scheduler.update_from_outcome(plan, StepOutcome(plan.step_id, sampled)):
            traces[update.request_id].token_times += [now + args.delivery_ms / 1000] * len(update.new_token_ids)
    return list(traces.values()), now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=int, nargs="+", default=[256, 384, 512, 8192], help="max_num_batched_tokens")
    parser.add_argument("--steps-in-flight", nargs="+", default=["2", "3", "auto"], choices=["1", "2", "3", "auto"])
    parser.add_argument("--rate", type=float, default=16.0, help="Poisson arrivals per second")
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--base-ms", type=float, default=4.1, help="a step's time before its rows and tokens")
    parser.add_argument("--decode-row-ms", type=float, default=0.055)
    parser.add_argument("--prefill-token-ms", type=float, default=0.021)
    parser.add_argument("--host-ms", type=float, default=0.3, help="from an outcome to the next plan on the worker")
    parser.add_argument("--delivery-ms", type=float, default=1.0, help="from a step's end to the client")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for budget in args.budget:
        for steps_in_flight in args.steps_in_flight:
            traces, duration = simulate(args, budget, steps_in_flight)
            print(format_summary(f"budget {budget}, steps in flight {steps_in_flight}", summarize(traces, duration)))


if __name__ == "__main__":
    main()
