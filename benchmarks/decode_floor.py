"""The floor of a dense model's batch-1 decode on a CUDA GPU:
`python benchmarks/decode_floor.py OUT.json --model Llama-3.1-8B [--quantization gptq] [--kv-cache-dtype fp8]`.

A decode token reads every weight of the decoder layers and the LM head once, one row of the embedding table, and
the KV cache of its context; the floor is those bytes over a device-to-device copy's bandwidth measured in the same
run (bytes read plus bytes written, as benchmarks/kernel_timings.py counts). The model is the dummy model the worker
loads with the same flags, so the bytes are its own tensors': 4-bit weights with their scales and zero points, FP8
weights with their scales. --context is the mean context of the timed tokens (`sluice bench latency`'s default 128
in / 128 out: 128 + 64). Compare with `sluice bench latency --in-process` of the same flags in the same call.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine

sys.path.append(str(Path(__file__).parents[1]))  # benchmarks/, behind the installed packages
from benchmarks.kernel_timings import copy_bandwidth_gbs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="Llama-3.1-8B")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--context", type=int, default=192)
    args = parser.parse_args()
    worker = WorkerEngine.load(WorkerConfig(model=args.model, load_format="dummy", dtype="bfloat16", device="cuda",
                                            quantization=args.quantization))
    config = worker.model_config
    if config.moe is not None:
        raise SystemExit(f"{args.model} is a mixture of experts: a token reads only its routed experts")
    weight_bytes = decoder_bytes(worker.model)
    kv_bytes = 2 * config.num_layers * config.num_kv_heads * config.head_dim * args.context * \
        (1 if args.kv_cache_dtype == "fp8" else 2)
    del worker
    torch.cuda.empty_cache()
    copy_gbs = copy_bandwidth_gbs("cuda")
    result = {"model": args.model, "quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype,
              "context": args.context, "weight_gb": weight_bytes / 1e9, "kv_gb": kv_bytes / 1e9, "copy_gbs": copy_gbs,
              "floor_ms": (weight_bytes + kv_bytes) / copy_gbs / 1e6,
              "device": torch.cuda.get_device_name()}
    print(f"{args.model} {args.quantization}: {result['weight_gb']:.3f} GB of weights + {result['kv_gb']:.3f} GB of "
          f"KV at {copy_gbs:,.0f} GB/s copy: floor {result['floor_ms']:.3f} ms a token")
    with open(args.out, "w") as out:
        json.dump(result, out, indent=2)


def decoder_bytes(model: torch.nn.Module) -> int:
    """The bytes of every parameter and buffer a decode token reads: all but the embedding table, of which it reads
    a row (the whole table where the LM head is tied to it)."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    embedding = tensors.pop("embed_tokens.weight")
    tied = any(t is embedding for t in tensors.values()) or model.lm_head.weight is embedding
    total = sum(t.numel() * t.element_size() for t in tensors.values() if t is not embedding)
    row = embedding.shape[1] * embedding.element_size()
    return total + (embedding.numel() * embedding.element_size() if tied else row)


if __name__ == "__main__":
    main()
