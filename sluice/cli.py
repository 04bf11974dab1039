"""The `sluice` command. The only place that reads environment variables."""
import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

_DEFAULT_ROUTER_ADDRESS = "127.0.0.1:50051"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sluice", description="An LLM inference server over gRPC.")
    parser.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)
    _add_fetch_model(commands)
    _add_serve(commands)
    _add_worker(commands)
    _add_scheduler(commands)
    _add_router(commands)
    _add_generate(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args.run(args)


def _cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE_DIR", Path.home() / ".cache" / "sluice"))


def _default_model() -> Path:
    from sluice.model_store import fetch_default_model

    return fetch_default_model(_cache_dir())


def _add_fetch_model(commands) -> None:
    command = commands.add_parser("fetch-model", help="download the default model into the cache folder")
    command.set_defaults(run=lambda args: print(_default_model()))


def _add_worker_options(parser) -> None:
    parser.add_argument("--model", type=Path, help="a Hugging Face folder or a .gguf file (default: SmolLM2-135M)")
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache budget on the CPU")


def _add_scheduler_options(parser) -> None:
    parser.add_argument("--num-blocks", type=int, default=0, help="KV blocks (default: sized by the worker)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--policy", default="priority", choices=["priority", "fcfs"])


def _worker_flags(args) -> list[str]:
    return ["--model", str(args.model), "--load-format", args.load_format, "--dtype", args.dtype,
            "--device", args.device, "--kv-cache-gib", str(args.kv_cache_gib)]


def _scheduler_flags(args) -> list[str]:
    flags = ["--num-blocks", str(args.num_blocks), "--block-size", str(args.block_size),
             "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
             "--max-model-len", str(args.max_model_len), "--policy", args.policy]
    return [*flags, "--no-prefix-caching"] if args.no_prefix_caching else flags


def _add_serve(commands) -> None:
    command = commands.add_parser("serve", help="start router, scheduler and worker; Ctrl-C stops all three")
    command.add_argument("--host", default="127.0.0.1")
    command.add_argument("--port", type=int, default=50051, help="the router's port")
    command.add_argument("--startup-timeout", type=float, default=600.0)
    _add_worker_options(command)
    _add_scheduler_options(command)
    command.set_defaults(run=_serve)


def _serve(args) -> None:
    from sluice.launcher import ServeLayout, free_port, start_services, stop_services, wait_until_serving

    args.model = args.model or _default_model()
    layout = ServeLayout(args.host, args.port, free_port(args.host), free_port(args.host))
    processes = start_services(layout, _worker_flags(args), _scheduler_flags(args),
                               ["--model", str(args.model)])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        wait_until_serving(layout.router_address, "sluice.v1.Generation", args.startup_timeout, processes)
        print(f"sluice is serving {args.model.name} on {layout.router_address}", flush=True)
        while all(process.poll() is None for process in processes):
            time.sleep(0.5)
        sys.exit("sluice: a service exited; stopping the others")
    except KeyboardInterrupt:
        pass
    finally:
        stop_services(processes)


def _add_worker(commands) -> None:
    command = commands.add_parser("worker", help="run one worker (data plane)")
    command.add_argument("--listen", default="127.0.0.1:50053")
    _add_worker_options(command)
    command.set_defaults(run=_worker)


def _worker(args) -> None:
    from worker_svc.config import WorkerConfig
    from worker_svc.server import serve

    config = WorkerConfig(model=str(args.model or _default_model()), load_format=args.load_format, dtype=args.dtype,
                          device=args.device, kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)))
    _run_service(serve(config, args.listen))


def _add_scheduler(commands) -> None:
    command = commands.add_parser("scheduler", help="run the scheduler (control plane)")
    command.add_argument("--listen", default="127.0.0.1:50052")
    command.add_argument("--worker", default="127.0.0.1:50053", help="the worker's address")
    _add_scheduler_options(command)
    command.set_defaults(run=_scheduler)


def _scheduler(args) -> None:
    from scheduler_svc.server import serve

    _run_service(serve(args.worker, args.listen, num_blocks=args.num_blocks, block_size=args.block_size,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       max_model_len=args.max_model_len, enable_prefix_caching=not args.no_prefix_caching,
                       policy=args.policy))


def _add_router(commands) -> None:
    command = commands.add_parser("router", help="run the public router")
    command.add_argument("--listen", default=_DEFAULT_ROUTER_ADDRESS)
    command.add_argument("--scheduler", default="127.0.0.1:50052", help="the scheduler's address")
    command.add_argument("--model", type=Path, help="where the tokenizer is (default: SmolLM2-135M)")
    command.set_defaults(run=_router)


def _router(args) -> None:
    from router.server import serve

    _run_service(serve(args.model or _default_model(), args.scheduler, args.listen))


def _run_service(coroutine) -> None:
    async def run():
        task = asyncio.ensure_future(coroutine)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(run())


def _add_generate(commands) -> None:
    command = commands.add_parser("generate", help="stream one generation from a running router")
    command.add_argument("prompt")
    command.add_argument("--address", default=os.environ.get("SLUICE_ADDRESS", _DEFAULT_ROUTER_ADDRESS))
    command.add_argument("--max-tokens", type=int, default=256)
    command.add_argument("--temperature", type=float, default=0.0)
    command.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    command.add_argument("--json", action="store_true", help="end with one JSON object describing the result")
    command.set_defaults(run=_generate)


def _generate(args) -> None:
    import grpc

    from sluice.client import SluiceClient, chat_request, text_request

    build = chat_request if args.chat else text_request
    request = build(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature)
    with SluiceClient(args.address) as client:
        try:
            result = client.generate(request, on_text=lambda text: print(text, end="", flush=True))
        except grpc.RpcError as error:
            sys.exit(f"\nerror: {error.code().name}: {error.details()}")
    print()
    if args.json:
        print(json.dumps(result.to_json()))


if __name__ == "__main__":
    main()
