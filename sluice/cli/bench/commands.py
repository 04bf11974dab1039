"""The `sluice bench` subcommands."""
import asyncio
import functools
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from sluice.cli.bench.report import format_summary, summarize
from sluice.cli.bench.sampling_flags import add_sampling_options, with_sampling
from sluice.cli.bench.workload import (BenchRequest, as_text, length_ranges, nano_vllm_workload, random_workload,
                                       read_workload, write_workload)
from sluice.cli.compile_cache import use_compile_cache
from sluice.cli.dummy_folder import router_model, router_model_flags
from sluice.cli.model_store import cache_dir
from sluice.cli.service_flags import (add_router_process_options, add_scheduler_options, add_worker_options,
                                      scheduler_flags, scheduler_options, worker_config, worker_flags)


def add_bench_commands(commands) -> None:
    bench = commands.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)

    throughput = bench.add_parser("throughput", help="offline throughput: all requests at once")
    _add_engine_options(throughput)
    _add_workload_options(throughput, num_requests=256, input_len=(100, 1024), output_len=(100, 1024))
    throughput.add_argument("--in-process", action="store_true", help="the same engine without gRPC")
    throughput.add_argument("--baseline", choices=["hf"], help="also run Hugging Face transformers")
    throughput.add_argument("--hf-batch-size", type=int, default=256)
    throughput.add_argument("--client-processes", type=int, default=1,
                            help="load client processes, one event loop each, the requests dealt out among them")
    _add_image_options(throughput)
    throughput.set_defaults(run=_throughput)

    latency = bench.add_parser("latency", help="batch-1 time per output token")
    _add_engine_options(latency)
    _add_workload_options(latency, num_requests=3, input_len=(128, 128), output_len=(128, 128))
    latency.add_argument("--in-process", action="store_true")
    latency.add_argument("--baseline", choices=["hf"], help="also time Hugging Face transformers' generate at batch 1")
    _add_image_options(latency)
    latency.set_defaults(run=_latency)

    serve = bench.add_parser("serve", help="Poisson arrivals or fixed concurrency against a running router")
    serve.add_argument("--address", default="127.0.0.1:50051")
    serve.add_argument("--vocab-size", type=int, default=49152)
    serve.add_argument("--rate", type=float, help="requests per second (Poisson); default: all at once")
    serve.add_argument("--concurrency", type=int)
    serve.add_argument("--openai-url", help="send the load through this OpenAI-compatible gateway (smg in front of "
                                            "the router, e.g. http://127.0.0.1:8000) instead of to --address")
    serve.add_argument("--model", default="", help="the model name the gateway serves, with --openai-url")
    serve.add_argument("--text-prompts", metavar="TOKENIZER_JSON",
                       help="prompts that survive a round trip through this tokenizer as text: needed by "
                            "--openai-url, and given to a native run compared with it")
    _add_workload_options(serve, num_requests=200, input_len=(1024, 1024), output_len=(256, 256))
    serve.set_defaults(run=_serve)

    write = bench.add_parser("write-workload", help="write the requests of a workload as JSON, for --workload here "
                                                    "and for other engines")
    write.add_argument("path", type=Path)
    write.add_argument("--generator", choices=["sluice", "nano-vllm"], default="sluice",
                       help="sluice: the random workload of `bench throughput`; nano-vllm: its bench.py's draws")
    write.add_argument("--vocab-size", type=int, default=151936,
                       help="prompt token ids below it, with the sluice generator (default: Qwen3's)")
    _add_request_options(write, num_requests=256, input_len=(100, 1024), output_len=(100, 1024))
    write.set_defaults(run=_write_workload)


def _add_engine_options(parser) -> None:
    add_worker_options(parser, with_scheduler=True)
    add_scheduler_options(parser)
    add_router_process_options(parser)


def _add_request_options(parser, num_requests: int, input_len: tuple[int, int], output_len: tuple[int, int]) -> None:
    parser.add_argument("--num-requests", type=int, default=num_requests)
    parser.add_argument("--input-len", type=int, nargs=2, default=input_len, metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=output_len, metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=0, help="of the prompts, lengths and sampled draws")


def _add_workload_options(parser, num_requests: int, input_len: tuple[int, int], output_len: tuple[int, int]) -> None:
    _add_request_options(parser, num_requests, input_len, output_len)
    parser.add_argument("--workload", type=Path, help="run the requests of this file (`bench write-workload`) "
                                                      "instead of random ones")
    parser.add_argument("--connections", type=int,
                        help="client connections the requests are spread over (default: 1, or 4 per router process "
                             "where the benchmark starts several)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    add_sampling_options(parser)


def _add_image_options(parser) -> None:
    parser.add_argument("--images-per-request", type=int, default=0,
                        help="random-pixel PNG images of each request's own, sent through the gRPC stack before its "
                             "prompt as text (--input-len of text tokens) in one chat message; the report gives the "
                             "prompt tokens with the chat template's and the placeholders, and the vision encoder's "
                             "share of the worker's step time")
    parser.add_argument("--image-size", type=int, nargs=2, default=(448, 448), metavar=("WIDTH", "HEIGHT"))


def _vocab_size(args) -> int:
    return _prompt_vocab_size(args.load_format, str(args.model))


@functools.cache  # the workload's and the warm-up's prompts read it: the tokenizer loads once
def _prompt_vocab_size(load_format: str, model: str) -> int:
    """The token ids random prompts draw from: the model's vocabulary, within its tokenizer's where the router has one
    (it refuses ids past the tokenizer's; a config's vocabulary is often padded beyond them)."""
    if load_format == "dummy":
        from sluice.worker.loading.shapes import shape_config

        config = shape_config(model)
    else:
        config = json.loads((Path(model) / "config.json").read_text())
    vocab_size = config.get("text_config", config)["vocab_size"]  # a vision-language model's is its language model's
    tokenizer_folder = router_model(load_format, model, cache_dir())
    if tokenizer_folder is None:
        return vocab_size
    from transformers import AutoTokenizer

    return min(vocab_size, len(AutoTokenizer.from_pretrained(tokenizer_folder)))


def _resolve_model(args) -> None:
    if not args.model:
        from sluice.cli.model_store import default_model

        args.model = str(default_model())


def _workload(args) -> list[BenchRequest]:
    """The requests of --workload, whose count and length ranges then replace the flags' (for the warm-up and the
    report), or random ones."""
    if args.workload:
        requests = read_workload(args.workload)
        args.num_requests, (args.input_len, args.output_len) = len(requests), length_ranges(requests)
    else:
        requests = _with_images(args, random_workload(args.num_requests, tuple(args.input_len),
                                                      tuple(args.output_len), _vocab_size(args), args.seed), args.seed)
    return with_sampling(requests, args)


def _warm_up(args) -> list[BenchRequest]:
    """Four requests drawn like the workload's, from another seed: they hit no prefix cache in the timed run."""
    requests = random_workload(4, tuple(args.input_len), tuple(args.output_len), _vocab_size(args), args.seed + 1)
    return with_sampling(_with_images(args, requests, args.seed + 1), args)


def _with_images(args, requests: list[BenchRequest], seed: int) -> list[BenchRequest]:
    if not args.images_per_request:
        return requests
    from sluice.cli.bench.image_workload import with_images
    from sluice.router.multimodal.vision_prompts import model_takes_images

    folder = router_model(args.load_format, args.model, cache_dir())
    if folder is None or not model_takes_images(folder):
        raise SystemExit("--images-per-request needs a vision-language model")
    return with_images(requests, folder / "tokenizer.json", args.images_per_request, tuple(args.image_size), seed)


def _through_grpc(args, requests: list[BenchRequest], concurrency: int | None = None,
                  client_processes: int = 1) -> dict:
    from sluice.cli.bench.client_processes import timed_load
    from sluice.cli.bench.grpc_load import connections_for, run_load
    from sluice.cli.bench.process_cpu import ProcessCpu, format_busy_cores
    from sluice.cli.bench.worker_metrics import encoder_share, step_time_sums
    from sluice.cli.launcher import ServeLayout, free_ports, start_services, stop_services, wait_until_routers_serve
    from sluice.client import scheduler_load

    layout = ServeLayout.on_free_ports(num_ranks=args.tensor_parallel_size * args.pipeline_parallel_size,
                                       router_processes=args.router_processes)
    metrics_port = free_ports(1)[0] if args.images_per_request else None
    worker = worker_flags(args) + (["--metrics-port", str(metrics_port)] if metrics_port else [])
    router = router_model_flags(args.load_format, args.model, cache_dir())
    processes = start_services(layout, worker, scheduler_flags(args), [router] * args.router_processes)
    connections = args.connections or connections_for(args.router_processes)
    try:
        wait_until_routers_serve(layout, 900, processes)
        asyncio.run(run_load(layout.router_address, _warm_up(args), connections=connections))
        services = dict(zip(("worker", "scheduler", *layout.router_names), (process.pid for process in processes)))
        cpu = ProcessCpu(services)
        before = scheduler_load(layout.scheduler_address)
        step_times = [step_time_sums(metrics_port)] if metrics_port else []
        traces, duration, client_cpu = timed_load(layout.router_address, requests, concurrency, connections,
                                                  client_processes)
        busy_cores = cpu.busy_cores(duration) | {"client": client_cpu}
        after = scheduler_load(layout.scheduler_address)
        step_times += [step_time_sums(metrics_port)] if metrics_port else []
    finally:
        stop_services(processes)
    print(format_busy_cores(busy_cores))
    result = {"name": "sluice (gRPC stack)", **summarize(traces, duration), "busy_cores": busy_cores}
    if step_times:
        result["text_prompt_tokens"] = sum(len(request.prompt_token_ids) for request in requests)
        result["vision_encoder_share"] = encoder_share(*step_times)
        print(f"prompt tokens: {result['prompt_tokens']} processed, {result['text_prompt_tokens']} of them text (the "
              f"rest the chat template's and image placeholders)\n"
              f"vision encoder: {result['vision_encoder_share']:.1%} of step time")
    if args.speculative_method:
        result["speculation"] = speculation = {name: getattr(after, name) - getattr(before, name)
                                               for name in ("num_draft_tokens", "num_accepted_tokens")}
        print(f"speculative decoding while timed: {speculation['num_accepted_tokens']} of "
              f"{speculation['num_draft_tokens']} proposed tokens accepted")
    return result


def _offline_engine(args, enable_prefix_caching: bool):
    if args.images_per_request:
        raise SystemExit("--in-process takes token ids: images go through the gRPC stack")
    if args.tensor_parallel_size * args.pipeline_parallel_size > 1:
        raise SystemExit("--in-process runs one worker; a tensor- or pipeline-parallel replica is measured through "
                         "the gRPC stack")
    use_compile_cache(args.compile_cache)
    from sluice.cli.offline import OfflineEngine
    from sluice.worker.engine import WorkerEngine

    worker = WorkerEngine.load(worker_config(args))
    return OfflineEngine(worker, **{**scheduler_options(args), "enable_prefix_caching": enable_prefix_caching})


def _timed_generate(engine, requests: list[BenchRequest]) -> tuple[int, float]:
    """(output tokens, seconds) of generating the requests all at once."""
    params = [r.sampling_params() for r in requests]
    started = time.perf_counter()
    results = engine.generate([r.prompt_token_ids for r in requests], params)
    return sum(len(r.token_ids) for r in results), time.perf_counter() - started


def _in_process(args, requests: list[BenchRequest]) -> dict:
    engine = _offline_engine(args, enable_prefix_caching=args.enable_prefix_caching)
    _timed_generate(engine, _warm_up(args))
    output_tokens, duration = _timed_generate(engine, requests)
    prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
    return {"name": "sluice (in process)", "requests": len(requests), "duration_s": duration,
            "requests_per_s": len(requests) / duration, "output_tokens_per_s": output_tokens / duration,
            "total_tokens_per_s": (output_tokens + prompt_tokens) / duration}


def _hf_model(args):
    """The model in Hugging Face transformers, of the same weights and dtype, on the same device."""
    import gc

    import torch

    from sluice.cli.bench.hf_baseline import load_hf_model
    from sluice.worker.config import WorkerConfig

    gc.collect()  # the Sluice engine measured before gives its device memory back
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return load_hf_model(str(args.model), args.load_format, WorkerConfig(model="", dtype=args.dtype).torch_dtype,
                         args.device)


def _hf(args, requests: list[BenchRequest]):
    """Hugging Face's static batches, then its continuous batching, each result as it is measured."""
    from sluice.cli.bench.hf_baseline import continuous_generate, static_generate

    model = _hf_model(args)
    yield static_generate(model, requests, args.hf_batch_size)
    yield continuous_generate(model, requests)


def _throughput(args) -> None:
    _resolve_model(args)
    requests = _workload(args)
    results = [_in_process(args, requests) if args.in_process
               else _through_grpc(args, requests, client_processes=args.client_processes)]
    _print_throughput(results[0], results[0]["output_tokens_per_s"])
    for result in _hf(args, requests) if args.baseline == "hf" else ():
        results.append(result)
        _print_throughput(result, results[0]["output_tokens_per_s"])
    _write(args.out, {"workload": _vars_of(args), "results": results})


def _print_throughput(result: dict, sluice_rate: float) -> None:
    result["sluice_speedup"] = sluice_rate / result["output_tokens_per_s"]
    print(f"{result['name']:34} {result['requests_per_s']:8.2f} req/s {result['output_tokens_per_s']:10.1f} "
          f"output tok/s {result['total_tokens_per_s']:10.1f} total tok/s   sluice x{result['sluice_speedup']:.2f}",
          flush=True)


def _latency(args) -> None:
    _resolve_model(args)
    requests = _workload(args)
    if args.output_len[0] < 2:
        raise SystemExit("--output-len must be at least 2: the time per token is measured after the first")
    if args.in_process:
        # time per output token after the first: a whole generation less one of a single token, no prefix cache
        engine = _offline_engine(args, enable_prefix_caching=False)
        _timed_generate(engine, _warm_up(args)[:1])
        per_token = []
        for request in requests:
            _, first_token = _timed_generate(engine, [replace(request, max_tokens=1)])
            _, whole = _timed_generate(engine, [request])
            per_token.append((whole - first_token) / (request.max_tokens - 1) * 1000)
        summary = {"name": "sluice (in process)", "ms_per_token": statistics.median(per_token)}
    else:
        result = _through_grpc(args, requests, concurrency=1)
        summary = {"name": "sluice (gRPC stack)", "ms_per_token": result["tpot_ms"]["p50"],
                   "ttft_ms": result["ttft_ms"]["p50"], "duration_s": result["duration_s"],
                   "busy_cores": result["busy_cores"]}
    print(f"{summary['name']}: {summary['ms_per_token']:.3f} ms per output token (batch 1)")
    results = [summary]
    if args.baseline == "hf":
        from sluice.cli.bench.hf_baseline import batch_one_generate

        results.append(batch_one_generate(_hf_model(args), requests))
        print(f"{results[1]['name']}: {results[1]['ms_per_token']:.3f} ms per output token (batch 1)   "
              f"sluice x{results[1]['ms_per_token'] / summary['ms_per_token']:.2f}")
    _write(args.out, {"workload": _vars_of(args), "results": results})


def _serve(args) -> None:
    from tqdm import tqdm

    from sluice.cli.bench.grpc_load import run_load
    from sluice.cli.bench.openai_load import run_openai_load

    requests = with_sampling(read_workload(args.workload) if args.workload else random_workload(
        args.num_requests, tuple(args.input_len), tuple(args.output_len), args.vocab_size, args.seed), args)
    if args.text_prompts:
        requests = as_text(requests, args.text_prompts)
    elif args.openai_url:
        raise SystemExit("--openai-url sends text: give --text-prompts the model's tokenizer.json")
    with tqdm(total=len(requests), desc="requests") as progress:
        options = (args.rate, args.concurrency, args.seed, progress)
        load = run_openai_load(args.openai_url, args.model, requests, *options) if args.openai_url \
            else run_load(args.address, requests, *options, connections=args.connections or 1)
        traces, duration = asyncio.run(load)
    summary = summarize(traces, duration)
    front = f"through {args.openai_url}" if args.openai_url else f"at {args.address}"
    print(format_summary(f"{front}: rate {args.rate or 'inf'} req/s, concurrency {args.concurrency or 'unbounded'}",
                         summary))
    _write(args.out, {"workload": _vars_of(args), "summary": summary,
                      "requests": [{"ttft": t.ttft, "itls": t.itls} for t in traces]})


def _write_workload(args) -> None:
    lengths = (args.num_requests, tuple(args.input_len), tuple(args.output_len))
    requests = nano_vllm_workload(*lengths, args.seed) if args.generator == "nano-vllm" \
        else random_workload(*lengths, args.vocab_size, args.seed)
    write_workload(args.path, requests)
    print(f"{len(requests)} requests written to {args.path}")


def _vars_of(args) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "run"}


def _write(path: Path | None, payload: dict) -> None:
    if path is not None:
        path.write_text(json.dumps(payload, indent=2))
