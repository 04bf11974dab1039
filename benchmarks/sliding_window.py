"""Sliding-window attention on a CUDA GPU: the KV blocks a window saves, and the windowed layers' share of a step.

    python benchmarks/sliding_window.py OUT.json [--parts memory share] [--device cuda:K]
    python benchmarks/sliding_window.py OUT.json --tiny

Memory: Mistral-7B-v0.1 (a 4,096-token window in every layer), dummy bf16 weights, 8 prompts of 32,704 random tokens
and 64 output tokens each (together the model's 32,768-token context; more output tokens than the 32 steps the 8
prompts take to prefill, so that all 8 run together once prefilled), submitted at once (max_num_seqs 8, the default
8,192-token step budget). It runs as the model is, then again without its window: the same config with sliding_window
null (this script's override, not a product option), so every layer attends to the whole context and the scheduler
releases no block. The KV pool is sized as the worker sizes it (gpu_memory_utilization 0.9); 8 whole requests of full
attention need 16,384 blocks of 2 MiB (32 GiB, beside 13.5 GiB of weights), and a pool short of that is reported (full
attention then preempts, which `preemptions` shows). As each step launches, just after the scheduler allocated its
blocks, the BlockManager's blocks in use are read: the peak, and the count at the last step that ran all 8 requests
(each near its whole length), with the bytes they stand for, the run's wall time (CUDA graphs on, after a warm-up
generation), and the window's saving (full attention's blocks over the window's).

Share: Gemma-3-4B (five layers of a 1,024-token window to one global layer) and gpt-oss-20b (layers of a 128-token
window alternating with global ones), dummy bf16 weights, decode steps of batch 1 over an 8,192-token prompt, of 32
such requests, and of the standard throughput workload (256 requests of 100-1,024 tokens in and out) from its 400th
decode step. The worker runs eagerly (enforce_eager, no programmatic dependent launch) with one step in flight; this
script wraps its attention operator (ops.attention: the attention kernel alone, not the projections, the rope or the
cache writes) in torch.profiler record_function ranges named by the layer's kind (a window or none), in this process
only, and profiles a window of decode steps. A range's time is the device time of the kernels launched inside it; the
step's time is the device time of every kernel in the window, which is what a step replayed from CUDA graphs runs, less
its launch gaps. The eager wall time per step (profiler on) is shown beside it, and the JSON names the kernels counted
as attention and the ranges per step (one per layer of the kind), so the attribution can be checked.

--tiny runs tiny versions of the three shapes on the CPU in float32 with plain torch operators (a range's time is its
CPU time, the step's its wall time): a check that the script runs (tests/bench/test_sliding_window.py), not a
measurement. Results go to OUT.json as they are measured; tables go to stdout.
"""
import argparse
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from sluice.cli.bench.workload import BenchRequest, random_workload
from sluice.cli.offline import OfflineEngine
from sluice.core.sampling_params import SamplingParams
from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.plain_torch import TorchOps
from sluice.worker.runner.kv_cache import bytes_per_block

SLIDING, GLOBAL = "attention.sliding", "attention.global"
GIB = 1 << 30


@dataclass(frozen=True)
class MemoryCase:
    model: str
    hf: dict
    num_prompts: int
    prompt_len: int
    output_len: int
    max_num_batched_tokens: int = 8192


@dataclass(frozen=True)
class DecodeCase:
    name: str
    num_requests: int
    input_lens: tuple[int, int]
    output_lens: tuple[int, int]
    first_decode_step: int  # the pure decode step (counted from 0) the profile starts at
    num_steps: int


@dataclass(frozen=True)
class Setup:
    device: str
    dtype: str
    memory: MemoryCase
    share_models: dict[str, dict]  # name -> Hugging Face config
    decode_cases: tuple[DecodeCase, ...]


def gpu_setup(device: str) -> Setup:
    return Setup(device, "bfloat16", MemoryCase("Mistral-7B-v0.1", shape_config("Mistral-7B-v0.1"), 8, 32_704, 64),
                 {name: shape_config(name) for name in ("Gemma-3-4B", "gpt-oss-20b")},
                 (DecodeCase("batch 1, 8k prompt", 1, (8192, 8192), (32, 32), 8, 16),
                  DecodeCase("batch 32, 8k prompts", 32, (8192, 8192), (32, 32), 8, 16),
                  DecodeCase("standard workload", 256, (100, 1024), (100, 1024), 400, 10)))


_TINY_DIMS = {"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "vocab_size": 512}


def _tiny(shape: str, **fields) -> dict:
    return shape_config(shape) | _TINY_DIMS | fields


def tiny_setup() -> Setup:
    sliding, full = "sliding_attention", "full_attention"
    return Setup("cpu", "float32",
                 MemoryCase("tiny Mistral", _tiny("Mistral-7B-v0.1", num_hidden_layers=2, sliding_window=32), 8, 216,
                            40, max_num_batched_tokens=64),
                 {"tiny Gemma-3": _tiny("Gemma-3-4B", num_hidden_layers=6, sliding_window=16,
                                        layer_types=[sliding] * 5 + [full]),
                  "tiny gpt-oss": _tiny("gpt-oss-20b", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                                        sliding_window=8, layer_types=[sliding, full])},
                 (DecodeCase("batch 1", 1, (64, 64), (8, 8), 2, 4),
                  DecodeCase("batch 4", 4, (64, 64), (8, 8), 2, 4),
                  DecodeCase("standard workload", 8, (16, 64), (8, 16), 2, 4)))


def load_worker(setup: Setup, name: str, hf: dict, eager: bool) -> tuple[WorkerEngine, TorchOps]:
    """A worker on random weights of the config, and the operators its model calls."""
    config = WorkerConfig(model=name, load_format="dummy", dtype=setup.dtype, device=setup.device,
                          kv_cache_gib=0.0625, enforce_eager=eager, dependent_launch=not eager)
    model_config = ModelConfig.from_hf(hf)
    state = random_state_dict(hf, config.torch_dtype, torch.device(setup.device), config.seed)
    loaded = ModelLoader(config).build(model_config, to_worker_layout(state, model_config))
    return WorkerEngine(config, loaded), loaded.ops


def prompts_and_params(requests: list[BenchRequest]) -> tuple[list[list[int]], list[SamplingParams]]:
    return [r.prompt_token_ids for r in requests], [r.sampling_params() for r in requests]


def release_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# -- memory: blocks in use with the window and without


class BlockWatch:
    """A worker that reads the scheduler's KV blocks in use as each step launches, just after they were allocated: the
    peak, and the count at the last step that ran every request (each near its whole length)."""

    def __init__(self, worker: WorkerEngine, engine: OfflineEngine, num_requests: int):
        self.worker = worker
        self.block_manager = engine.scheduler.block_manager
        self.num_requests = num_requests
        self.peak_blocks = self.all_running_blocks = 0

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def launch(self, plan):
        used = self.block_manager.num_used_blocks
        self.peak_blocks = max(self.peak_blocks, used)
        if len(plan.num_scheduled_tokens) == self.num_requests:
            self.all_running_blocks = used
        return self.worker.launch(plan)


def measure_blocks(setup: Setup, case: MemoryCase, window: bool) -> dict:
    hf = case.hf if window else case.hf | {"sliding_window": None}
    worker, _ = load_worker(setup, case.model, hf, eager=False)
    engine = OfflineEngine(worker, max_model_len=case.prompt_len + case.output_len, max_num_seqs=case.num_prompts,
                           max_num_batched_tokens=case.max_num_batched_tokens)
    warm_up_len = min(case.prompt_len, 1024)
    engine.generate(*prompts_and_params(random_workload(2, (warm_up_len,) * 2, (4, 4), hf["vocab_size"], seed=1)))
    watch = engine.worker = BlockWatch(worker, engine, case.num_prompts)
    requests = random_workload(case.num_prompts, (case.prompt_len,) * 2, (case.output_len,) * 2, hf["vocab_size"])
    started = time.perf_counter()
    engine.generate(*prompts_and_params(requests))
    wall_s = time.perf_counter() - started
    block_size = engine.scheduler.config.block_size
    block_bytes = bytes_per_block(worker.local_config, block_size, worker.kv_cache_dtype)
    whole_requests = case.num_prompts * -(-(case.prompt_len + case.output_len) // block_size)
    return {"attention_window": worker.attention_window, "block_size": block_size, "block_bytes": block_bytes,
            "pool_blocks": engine.scheduler.block_manager.num_total_blocks, "whole_requests_blocks": whole_requests,
            "peak_blocks": watch.peak_blocks, "peak_gib": watch.peak_blocks * block_bytes / GIB,
            "all_running_blocks": watch.all_running_blocks,
            "all_running_gib": watch.all_running_blocks * block_bytes / GIB,
            "preemptions": engine.scheduler.num_preemptions, "wall_s": wall_s}


def measure_memory(setup: Setup) -> dict:
    case = setup.memory
    print(f"== KV blocks in use: {case.model}, {case.num_prompts} prompts x {case.prompt_len:,} tokens + "
          f"{case.output_len} out, step budget {case.max_num_batched_tokens:,} tokens", flush=True)
    print(f"{'attention':>12} {'pool':>7} {'peak':>7} {'GiB':>6} {'all run':>7} {'GiB':>6} {'preempt':>7} "
          f"{'wall s':>7}")
    result = {"case": {name: value for name, value in asdict(case).items() if name != "hf"}}
    for name, window in (("window", True), ("full", False)):
        row = result[name] = measure_blocks(setup, case, window)
        release_memory(setup.device)
        label = f"window {row['attention_window']}" if row["attention_window"] else "full"
        print(f"{label:>12} {row['pool_blocks']:>7} {row['peak_blocks']:>7} {row['peak_gib']:>6.2f} "
              f"{row['all_running_blocks']:>7} {row['all_running_gib']:>6.2f} {row['preemptions']:>7} "
              f"{row['wall_s']:>7.1f}", flush=True)
    window, full = result["window"], result["full"]
    if full["pool_blocks"] < full["whole_requests_blocks"]:
        print(f"full attention's {full['whole_requests_blocks']} blocks do not fit the pool of {full['pool_blocks']}")
    result["peak_saving"] = full["peak_blocks"] / window["peak_blocks"]
    result["all_running_saving"] = full["all_running_blocks"] / window["all_running_blocks"]
    print(f"the window holds {result['peak_saving']:.1f}x fewer blocks at the peak, "
          f"{result['all_running_saving']:.1f}x fewer with every request running", flush=True)
    return result


# -- share: the attention kernels of sliding and global layers in decode steps


def label_attention(ops: TorchOps) -> None:
    """Puts each call of ops.attention in a record_function range named by the layer's kind (in this process)."""
    attention = ops.attention

    def labelled(*args, sliding_window: int = 0, **kwargs):
        with record_function(SLIDING if sliding_window else GLOBAL):
            return attention(*args, sliding_window=sliding_window, **kwargs)

    ops.attention = labelled


class DecodeProfile:
    """A worker that profiles `num_steps` steps from its `first`-th pure decode step on (one step in flight)."""

    def __init__(self, worker: WorkerEngine, first: int, num_steps: int):
        self.worker = worker
        self.first, self.num_steps = first, num_steps
        self.cuda = worker.device.type == "cuda"
        self.num_decodes = 0
        self.steps: list[dict] = []  # the profiled steps' sizes
        self.split: dict | None = None
        self._profiler = None
        self._started = 0.0

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def launch(self, plan):
        decode = sum(plan.num_scheduled_tokens.values()) == len(plan.num_scheduled_tokens)
        if decode and self.num_decodes == self.first:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self._profiler = profile(activities=activities)
            self._profiler.start()
            self._started = time.perf_counter()
        self.num_decodes += decode
        if self._profiler is not None:
            contexts = [r.num_computed_tokens for r in plan.cached_requests]
            self.steps.append({"decode": decode, "seqs": len(plan.num_scheduled_tokens),
                               "context": sum(contexts) / max(len(contexts), 1)})
        return self.worker.launch(plan)

    def finish(self, step):
        outcome = self.worker.finish(step)
        if self._profiler is not None and len(self.steps) == self.num_steps:
            if self.cuda:
                torch.cuda.synchronize()
            wall_us = (time.perf_counter() - self._started) * 1e6
            self._profiler.stop()
            self.split = attention_split(self._profiler.events(), self.cuda, wall_us, self.num_steps)
            self._profiler = None
        return outcome


def attention_split(events, cuda: bool, wall_us: float, num_steps: int) -> dict:
    """Per step: the time of the sliding and global layers' attention ranges, and of the whole step (the device time of
    every kernel on a GPU, the wall time on the CPU)."""
    if cuda:
        total_us = sum(e.device_time_total for e in events
                       if e.device_type == DeviceType.CUDA and not e.is_user_annotation)
    else:
        total_us = wall_us
    split = {"basis": "CUDA kernel time" if cuda else "CPU wall time", "step_ms": total_us / num_steps / 1e3,
             "eager_wall_ms": wall_us / num_steps / 1e3}
    for label in (SLIDING, GLOBAL):
        ranges = [e for e in events if e.name == label and e.device_type == DeviceType.CPU]
        us = sum(e.device_time_total if cuda else e.cpu_time_total for e in ranges)
        kind = label.removeprefix("attention.")
        split |= {f"{kind}_ms": us / num_steps / 1e3, f"{kind}_share": us / total_us if total_us else 0.0,
                  f"{kind}_ranges_per_step": len(ranges) / num_steps,
                  f"{kind}_kernels": sorted({name for e in ranges for name in _kernel_names(e)})}
    return split


def _kernel_names(event) -> set[str]:
    return {kernel.name for kernel in event.kernels}.union(*(_kernel_names(child) for child in event.cpu_children))


def measure_share(setup: Setup, model: str, hf: dict) -> list[dict]:
    worker, ops = load_worker(setup, model, hf, eager=True)
    label_attention(ops)
    rows = []
    for case in setup.decode_cases:
        engine = OfflineEngine(worker, max_model_len=case.input_lens[1] + case.output_lens[1],
                               max_num_seqs=case.num_requests, steps_in_flight=1)
        watch = engine.worker = DecodeProfile(worker, case.first_decode_step, case.num_steps)
        engine.generate(*prompts_and_params(random_workload(case.num_requests, case.input_lens, case.output_lens,
                                                            hf["vocab_size"])))
        if watch.split is None:
            raise RuntimeError(f"{model}, {case.name}: the workload ended before its profile window did")
        steps = watch.steps
        row = {"model": model, "case": case.name, "window": max(worker.model_config.layer_windows, default=0),
               "profiled_steps": len(steps), "pure_decode_steps": sum(s["decode"] for s in steps),
               "seqs": sum(s["seqs"] for s in steps) / len(steps),
               "context": sum(s["context"] for s in steps) / len(steps)} | watch.split
        rows.append(row)
        print_share_row(row)
        del engine, watch
        release_memory(setup.device)
    return rows


def print_share_header() -> None:
    print(f"{'model':>14} {'case':>22} {'window':>6} {'seqs':>6} {'context':>8} {'step ms':>8} "
          f"{'sliding ms':>10} {'share':>6} {'global ms':>9} {'share':>6} {'eager wall ms':>13}", flush=True)


def print_share_row(row: dict) -> None:
    print(f"{row['model']:>14} {row['case']:>22} {row['window']:>6} {row['seqs']:>6.1f} {row['context']:>8.0f} "
          f"{row['step_ms']:>8.3f} {row['sliding_ms']:>10.3f} {row['sliding_share']:>6.1%} {row['global_ms']:>9.3f} "
          f"{row['global_share']:>6.1%} {row['eager_wall_ms']:>13.2f}", flush=True)


def write(path: str, result: dict) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", help="where to write the results as JSON")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:K")
    parser.add_argument("--parts", nargs="+", choices=("memory", "share"), default=["memory", "share"])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: a check that the script runs")
    args = parser.parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("benchmarks/sliding_window.py needs a CUDA device (or --tiny)", file=sys.stderr)
        return 2
    setup = tiny_setup() if args.tiny else gpu_setup(args.device)
    device = torch.cuda.get_device_name(setup.device) if setup.device.startswith("cuda") else "cpu"
    result = {"device": device, "dtype": setup.dtype, "torch": torch.__version__}
    print(f"{device}, {setup.dtype} dummy weights", flush=True)
    if "memory" in args.parts:
        result["memory"] = measure_memory(setup)
        write(args.json_out, result)
    if "share" in args.parts:
        print("== attention's share of a decode step (eager, one step in flight)", flush=True)
        print_share_header()
        result["attention_share"] = []
        for model, hf in setup.share_models.items():
            result["attention_share"] += measure_share(setup, model, hf)
            write(args.json_out, result)
            release_memory(setup.device)
    write(args.json_out, result)
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
