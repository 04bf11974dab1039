"""Command-line options of the worker, the scheduler and the router, shared by `sluice serve`, the services and
`sluice bench`."""
import argparse
from pathlib import Path

from sluice.serving.grpc_options import MAX_CLIENT_REQUEST_BYTES


def add_worker_options(parser) -> None:
    parser.add_argument("--model", type=Path, help="a Hugging Face folder or a .gguf file (default: SmolLM2-135M)")
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--quantization", default="auto", choices=["auto", "fp8"],
                        help="fp8: the decoder layers' projections in e4m3 with per-channel scales, activations "
                             "quantized per token (a GPU needs compute capability 8.9+; the CPU emulates it); auto: "
                             "as the checkpoint stores them (a pre-quantized FP8 folder is served in FP8)")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"],
                        help="fp8 (fp8_e4m3): the KV cache in e4m3 with per-layer k/v scales from the checkpoint "
                             "(1.0 where it has none), about twice the blocks of bf16 (a GPU needs compute "
                             "capability 8.9+); auto: the model dtype")
    parser.add_argument("--calculate-kv-scales", action="store_true",
                        help="with --kv-cache-dtype fp8: each layer's k/v scales from the keys and values of the "
                             "first step, for checkpoints without calibrated ones")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache budget on the CPU")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no CUDA graphs; every step builds its inputs on the host")
    parser.add_argument("--kernels", default="auto", choices=["auto", "triton", "torch"],
                        help="auto: Triton kernels on a GPU, plain torch on the CPU")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                        help="worker processes (ranks) that serve one model replica together; with --device cuda, "
                             "rank r runs on cuda:r (cuda:K: on cuda:K+r)")
    parser.add_argument("--dist-timeout", type=float, default=60.0,
                        help="seconds a rank waits in a collective for the others before it fails")
    parser.add_argument("--draft-model", default="",
                        help="with --speculative-method draft: a smaller model of the same vocabulary that proposes "
                             "tokens beside the target (a folder or .gguf file, or a shape name with "
                             "--draft-load-format dummy)")
    parser.add_argument("--draft-load-format", default="auto", choices=["auto", "dummy"])


def add_scheduler_options(parser) -> None:
    parser.add_argument("--num-blocks", type=int, default=0, help="KV blocks (default: sized by the worker)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--policy", default="priority", choices=["priority", "fcfs"])
    parser.add_argument("--max-waiting-requests", type=int, default=4096,
                        help="requests that may wait; more get RESOURCE_EXHAUSTED")
    parser.add_argument("--max-waiting-tokens", type=int, default=4_000_000,
                        help="tokens the waiting requests may hold; more get RESOURCE_EXHAUSTED")
    parser.add_argument("--speculative-method", choices=["ngram", "draft"],
                        help="speculative decoding: ngram proposes the tokens that followed the newest tokens earlier "
                             "in the prompt and output (prompt lookup), draft those of the worker's --draft-model; "
                             "the model verifies them in one step")
    parser.add_argument("--num-speculative-tokens", type=int, default=3, help="the most proposals per request-step")
    parser.add_argument("--ngram-min", type=int, default=2, help="the shortest suffix ngram matches")
    parser.add_argument("--ngram-max", type=int, default=4, help="the longest suffix ngram matches")


def add_router_process_options(parser) -> None:
    parser.add_argument("--router-processes", type=_at_least_one, default=1,
                        help="router processes sharing the router's port (SO_REUSEPORT), each taking a share of "
                             "its client connections: one router's event loop carries about 25,000 streamed "
                             "tokens a second")


def _at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_router_limit_options(parser) -> None:
    parser.add_argument("--max-request-bytes", type=int, default=MAX_CLIENT_REQUEST_BYTES,
                        help="a larger client message gets RESOURCE_EXHAUSTED before it is read")


def worker_config_options(args) -> dict:
    """The WorkerConfig fields the worker options set, but for the model's path and the device, which each caller
    places."""
    return dict(load_format=args.load_format, dtype=args.dtype, quantization=args.quantization,
                kv_cache_dtype=args.kv_cache_dtype, calculate_kv_scales=args.calculate_kv_scales,
                kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)), gpu_memory_utilization=args.gpu_memory_utilization,
                enforce_eager=args.enforce_eager, kernels=args.kernels, draft_model=args.draft_model,
                draft_load_format=args.draft_load_format)


def worker_flags(args) -> list[str]:
    return ["--model", str(args.model), "--load-format", args.load_format, "--dtype", args.dtype,
            "--quantization", args.quantization, "--kv-cache-dtype", args.kv_cache_dtype,
            *(["--calculate-kv-scales"] * args.calculate_kv_scales), "--device", args.device,
            "--kv-cache-gib", str(args.kv_cache_gib),
            "--gpu-memory-utilization", str(args.gpu_memory_utilization), *(["--enforce-eager"] * args.enforce_eager),
            "--kernels", args.kernels, "--tensor-parallel-size", str(args.tensor_parallel_size),
            "--dist-timeout", str(args.dist_timeout), "--draft-model", args.draft_model,
            "--draft-load-format", args.draft_load_format]


def scheduler_flags(args) -> list[str]:
    flags = ["--num-blocks", str(args.num_blocks), "--block-size", str(args.block_size),
             "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
             "--max-model-len", str(args.max_model_len), "--policy", args.policy,
             "--max-waiting-requests", str(args.max_waiting_requests),
             "--max-waiting-tokens", str(args.max_waiting_tokens),
             "--num-speculative-tokens", str(args.num_speculative_tokens), "--ngram-min", str(args.ngram_min),
             "--ngram-max", str(args.ngram_max),
             *(["--speculative-method", args.speculative_method] if args.speculative_method else [])]
    return [*flags, "--no-prefix-caching"] if args.no_prefix_caching else flags


def router_limit_flags(args) -> list[str]:
    return ["--max-request-bytes", str(args.max_request_bytes)]
