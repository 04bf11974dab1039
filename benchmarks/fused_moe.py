"""The fused MoE layer on a CUDA GPU: `python benchmarks/fused_moe.py OUT.json [--sweep]`.

Qwen3-30B-A3B's experts (128 experts, top-8 renormalized, H 2048, I 768, bf16), by token count: decode sizes 1-256
and prefill sizes 4096 and 8192. The layer is routing (kernels.topk_softmax) plus kernels.fused_experts (align, the
gate/up and down grouped GEMMs, the top-k sum), replayed from a CUDA graph; the torch reference is topk_softmax_ref
plus fused_experts_ref (one expert at a time, as Hugging Face runs it), launched eagerly (it syncs on every expert's
token list, so it cannot be captured). Each row gives:
- the bytes of the experts' weights the step reads (w13 and w2 of each expert that receives a token, once) over the
  layer's time, in GB/s and as a fraction of a device-to-device copy measured in the same run (the copy counts bytes
  read plus bytes written, as benchmarks/kernel_timings.py does); the issue asks >= 70% at 1-256 tokens;
- the FLOPs (2 * pairs * 3 * H * I) over the layer's time, in TFLOP/s and as a fraction of a bf16 8192^3
  torch.matmul measured in the same run; the issue asks >= 60% at >= 4096 tokens;
- the time of each step alone (routing, align (none for a sparse step), gate/up, down) at the default launch
  config.
At decode sizes a timed replay runs the layer over ROUTINGS different routings, so consecutive calls read different
experts and the 50-60 MB L2 does not keep them (Qwen3-30B-A3B's 8 experts of one token are 75 MB); prefill sizes read
every expert (1.2 GB). --fp8 rows (a scale per row, as --quantization fp8 makes them) or --fp8 blocks (128 x 128
blocks, as Qwen3-30B-A3B-FP8 publishes them) runs e4m3 experts instead (bytes read count one per weight; the check
is against the reference on the same e4m3 weights). --w4a16 runs 4-bit experts (kernels.w4a16_layout.W4A16Stack,
groups of 128 with zero points, as AWQ publishes them; bytes read count the words, scales and zero points). --sweep
times launch configs per token count (--tokens picks some) and prints the best, for
kernels.fused_moe.moe_launch_config's table. Everything also goes to OUT.json.

`TRITON_INTERPRET=1 python benchmarks/fused_moe.py OUT.json --tiny` runs a tiny shape on the CPU in Triton's
interpreter (wall-clock times of one call, no bandwidth): a check that the script runs, not a measurement.
"""
import argparse
import dataclasses
import itertools
import json
import math
import sys
import time

import torch
import triton
import triton.testing

from sluice.kernels import (fused_experts, fused_experts_ref, moe_align_block_size, moe_down, moe_gate_up,
                            moe_launch_config, pair_blocks, topk_softmax, topk_softmax_ref)
from sluice.kernels.fp8_quant import FP8, FP8_MAX, quantize_rows_fp8
from sluice.kernels.fused_moe import SPARSE_STEP
from sluice.kernels.w4a16_layout import W4A16Stack, quantize, stack

DTYPE = torch.bfloat16
BF16_TOL = dict(atol=4e-2, rtol=2e-2)
FP8_BLOCK = (128, 128)
W4A16_GROUP = 128  # or the largest group that divides a tiny shape's H and I
ROUTINGS = 8  # routings a timed decode-size replay cycles through
DECODE_MAX = 256


@dataclasses.dataclass(frozen=True)
class MoeShape:
    name: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    tokens: tuple[int, ...]

    def expert_weights(self) -> int:
        return 3 * self.hidden * self.intermediate

    def flops(self, num_tokens: int) -> int:
        return 2 * num_tokens * self.top_k * 3 * self.hidden * self.intermediate


QWEN3_30B_A3B = MoeShape("Qwen3-30B-A3B", 128, 8, 2048, 768, (1, 2, 4, 8, 16, 32, 64, 128, 256, 4096, 8192))
TINY = MoeShape("tiny (interpreter)", 8, 2, 64, 48, (1, 5))


def time_ms(fn, device: str) -> float:
    """Median time of one call: replayed from a CUDA graph (no launch overhead), or wall clock off CUDA."""
    if device != "cuda":
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def eager_ms(fn, device: str) -> float:
    if device != "cuda":
        return time_ms(fn, device)
    return triton.testing.do_bench(fn, warmup=5, rep=50, return_mode="median")


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 2 GiB, counting bytes read plus bytes written."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / eager_ms(lambda: dst.copy_(src), "cuda") / 1e6


def matmul_tflops() -> float:
    """bf16 torch.matmul of 8192 x 8192 by 8192 x 8192 (cuBLAS)."""
    a, b = torch.randn(2, 8192, 8192, device="cuda", dtype=DTYPE)
    return 2 * 8192**3 / time_ms(lambda: a @ b, "cuda") / 1e9


@dataclasses.dataclass
class Experts:
    """The layer's stacked experts: bf16, e4m3 with scales per row or per block (block_shape), or 4-bit stacks."""
    w13: torch.Tensor | W4A16Stack
    w2: torch.Tensor | W4A16Stack
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    block_shape: tuple[int, int] | None = None

    @classmethod
    def random(cls, shape: MoeShape, device: str, fp8: str | None, w4a16: bool = False) -> "Experts":
        w13 = torch.randn(shape.num_experts, 2 * shape.intermediate, shape.hidden, device=device) / shape.hidden**0.5
        w2 = torch.randn(shape.num_experts, shape.hidden, shape.intermediate, device=device) / shape.intermediate**0.5
        if w4a16:
            group = math.gcd(W4A16_GROUP, shape.hidden, shape.intermediate)
            return cls(*(stack([quantize(w.to(DTYPE), group, sym=False) for w in weights]) for weights in (w13, w2)))
        if fp8 is None:
            return cls(w13.to(DTYPE), w2.to(DTYPE))
        block_shape = FP8_BLOCK if fp8 == "blocks" else None
        to_fp8 = _quantized_rows if block_shape is None else _quantized_blocks
        (w13_q, w13_scale), (w2_q, w2_scale) = to_fp8(w13), to_fp8(w2)
        return cls(w13_q, w2_q, w13_scale, w2_scale, block_shape)

    @property
    def kwargs(self) -> dict:
        return dict(w13_scale=self.w13_scale, w2_scale=self.w2_scale, block_shape=self.block_shape)

    @property
    def bytes_per_weight(self) -> float:
        """4-bit stacks' words, scales and zero points over their weights."""
        if not isinstance(self.w13, W4A16Stack):
            return self.w13.element_size()
        tensors = [t for t in (self.w13.qweight, self.w13.scales, self.w13.zeros) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors) / math.prod(self.w13.shape)

    @property
    def dot_dtype(self) -> torch.dtype:
        return FP8 if self.w13_scale is not None else DTYPE


def _quantized_rows(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, scales = quantize_rows_fp8(weights.flatten(0, 1))
    return values.view(weights.shape), scales.view(weights.shape[:2])


def _quantized_blocks(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] in e4m3 with a float32 scale per FP8_BLOCK (N and K multiples of the block)."""
    rows, cols = FP8_BLOCK
    blocks = weights.unflatten(2, (-1, cols)).unflatten(1, (-1, rows))  # [E, N / rows, rows, K / cols, cols]
    scales = blocks.abs().amax(dim=(2, 4)) / FP8_MAX
    values = (blocks / scales[:, :, None, :, None]).to(FP8).flatten(3, 4).flatten(1, 2)
    return values, scales


@dataclasses.dataclass
class Step:
    """One token count's inputs: x and ROUTINGS router logits (one for prefill sizes), routed once ahead."""
    x: torch.Tensor
    logits: list[torch.Tensor]
    routed: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def make(cls, shape: MoeShape, num_tokens: int, device: str) -> "Step":
        x = torch.randn(num_tokens, shape.hidden, device=device).to(DTYPE)
        count = ROUTINGS if num_tokens <= DECODE_MAX and device == "cuda" else 1
        logits = [torch.randn(num_tokens, shape.num_experts, device=device).to(DTYPE) for _ in range(count)]
        return cls(x, logits, [topk_softmax(lg, shape.top_k, True) for lg in logits])

    def experts_read(self) -> float:
        """Experts that receive a token, averaged over the routings."""
        return sum(ids.unique().numel() for _, ids in self.routed) / len(self.routed)


def bench_tokens(shape: MoeShape, num_tokens: int, experts: Experts, device: str, copy_gbs, peak_tflops) -> dict:
    step = Step.make(shape, num_tokens, device)
    x, k, w13, w2 = step.x, shape.top_k, experts.w13, experts.w2

    def layer():
        for logits in step.logits:
            fused_experts(x, *topk_softmax(logits, k, True), w13, w2, **experts.kwargs)

    def reference():
        fused_experts_ref(x, *topk_softmax_ref(step.logits[0], k, True), w13, w2, **experts.kwargs)

    out = fused_experts(x, *step.routed[0], w13, w2, **experts.kwargs)
    expected = fused_experts_ref(x, *step.routed[0], w13, w2, **experts.kwargs)
    err = (out.float() - expected.float()).abs().max().item()
    try:
        torch.testing.assert_close(out, expected, **BF16_TOL)
        ok = True
    except AssertionError:
        ok = False

    ms = time_ms(layer, device) / len(step.logits)
    ref_ms = eager_ms(reference, device)
    weight_bytes = step.experts_read() * shape.expert_weights() * experts.bytes_per_weight
    gbs, tflops = weight_bytes / ms / 1e6, shape.flops(num_tokens) / ms / 1e9
    row = dict(tokens=num_tokens, ok=ok, max_abs_err=err, us=ms * 1e3, ref_us=ref_ms * 1e3,
               experts_read=step.experts_read(), weight_gbs=gbs, tflops=tflops,
               frac_of_copy=gbs / copy_gbs if copy_gbs else None,
               frac_of_matmul=tflops / peak_tflops if peak_tflops else None)
    row.update(_breakdown_us(shape, step, experts, device))
    return row


def _breakdown_us(shape: MoeShape, step: Step, experts: Experts, device: str) -> dict:
    """Each step of the layer alone, on the first routing, at the default launch config."""
    x, logits, (weights, ids) = step.x, step.logits[0], step.routed[0]
    config = moe_launch_config(x.shape[0], shape.top_k, shape.num_experts, shape.hidden, shape.intermediate,
                               experts.dot_dtype, x.device)
    sparse = ids.numel() * SPARSE_STEP <= shape.num_experts  # fused_experts' choice: each pair its own block
    blocks = pair_blocks(ids, config["BLOCK_M"]) if sparse else \
        moe_align_block_size(ids, shape.num_experts, config["BLOCK_M"])
    scales = dict(block_shape=experts.block_shape)

    def gate_up():
        return moe_gate_up(x, experts.w13, blocks, shape.top_k, config, experts.w13_scale, **scales)

    h = gate_up()
    return dict(
        config=config,
        route_us=time_ms(lambda: topk_softmax(logits, shape.top_k, True), device) * 1e3,
        align_us=0.0 if sparse else
        time_ms(lambda: moe_align_block_size(ids, shape.num_experts, config["BLOCK_M"]), device) * 1e3,
        gate_up_us=time_ms(gate_up, device) * 1e3,
        down_us=time_ms(lambda: moe_down(h, experts.w2, weights, blocks, config, w2_scale=experts.w2_scale,
                                         **scales), device) * 1e3,
    )


def sweep_configs(num_tokens: int):
    """Launch configs worth timing at this token count (tiles whose pipeline fits 200 KB of shared memory)."""
    if num_tokens > DECODE_MAX:
        space = itertools.product((64, 128), (64, 128, 256), (64, 128), (4, 8), (3, 4), (8,))
    else:
        block_ms = (16,) if num_tokens <= 64 else (16, 32, 64)
        space = itertools.product(block_ms, (32, 64, 128, 256), (64, 128, 256), (4, 8), (2, 3, 4), (1,))
    for bm, bn, bk, warps, stages, group in space:
        if (bm * bk + bk * bn) * 2 * stages <= 200_000:
            yield dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group, num_warps=warps, num_stages=stages)


def sweep(shape: MoeShape, experts: Experts, token_counts: tuple[int, ...]) -> list[dict]:
    """The fastest launch config of fused_experts (routing excluded) per token count, against the default."""
    rows = []
    for num_tokens in token_counts:
        step = Step.make(shape, num_tokens, "cuda")

        def run(config):
            for weights, ids in step.routed:
                fused_experts(step.x, weights, ids, experts.w13, experts.w2, **experts.kwargs, launch_config=config)

        default_ms = time_ms(lambda: run(None), "cuda") / len(step.routed)
        best = (default_ms, None)
        for config in sweep_configs(num_tokens):
            try:
                ms = time_ms(lambda: run(config), "cuda") / len(step.routed)
            except Exception as e:  # noqa: BLE001 (a tile that does not fit: out of resources)
                print(f"  {num_tokens} tokens, {config}: {type(e).__name__}", file=sys.stderr)
                continue
            best = min(best, (ms, config), key=lambda b: b[0])
        rows.append(dict(tokens=num_tokens, default_us=default_ms * 1e3, best_us=best[0] * 1e3, best_config=best[1]))
        print(f"sweep {num_tokens:>6} tokens: default {default_ms * 1e3:9.1f} us, best {best[0] * 1e3:9.1f} us "
              f"{best[1] or '(the default)'}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", help="where to write the results as JSON")
    parser.add_argument("--sweep", action="store_true", help="also time launch configs per token count")
    parser.add_argument("--tiny", action="store_true", help="a tiny shape, on the CPU under TRITON_INTERPRET=1")
    parser.add_argument("--fp8", choices=["rows", "blocks"], help="e4m3 experts, a scale per row or per block")
    parser.add_argument("--w4a16", action="store_true", help="4-bit experts, groups of 128 with zero points")
    parser.add_argument("--tokens", type=int, nargs="+", help="the token counts to time (default: the shape's)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("benchmarks/fused_moe.py needs a CUDA device (or --tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    shape = TINY if args.tiny else QWEN3_30B_A3B
    torch.manual_seed(0)
    result = dict(shape=dataclasses.asdict(shape), torch=torch.__version__, triton=triton.__version__)
    copy_gbs = peak_tflops = None
    if cuda:
        props = torch.cuda.get_device_properties(device)
        result.update(device=props.name, sms=props.multi_processor_count)
        copy_gbs = result["copy_gbs"] = copy_bandwidth_gbs()
        peak_tflops = result["matmul_tflops"] = matmul_tflops()
        print(f"{props.name}: device-to-device copy {copy_gbs:.0f} GB/s (read + write), "
              f"bf16 matmul {peak_tflops:.0f} TFLOP/s")
    else:
        result["device"] = "cpu (Triton interpreter)"

    if args.fp8 and not cuda:
        print("--fp8 needs a CUDA device with FP8 dots", file=sys.stderr)
        return 2
    experts = Experts.random(shape, device, args.fp8, args.w4a16)
    token_counts = tuple(args.tokens or shape.tokens)
    print(f"\n{shape.name}: {shape.num_experts} experts, top-{shape.top_k}, H {shape.hidden}, I {shape.intermediate}, "
          f"{f'FP8 by {args.fp8}' if args.fp8 else '4-bit' if args.w4a16 else 'bf16'}; layer = routing + fused_experts")
    print(f"{'tokens':>6} {'check':>5} {'us':>9} {'ref us':>9} {'experts':>7} {'GB/s':>6} {'of copy':>7} "
          f"{'TFLOP/s':>7} {'of mm':>6}   {'route':>6} {'align':>6} {'gate_up':>8} {'down':>8}  config")
    result["layer"] = []
    for num_tokens in token_counts:
        row = bench_tokens(shape, num_tokens, experts, device, copy_gbs, peak_tflops)
        result["layer"].append(row)
        frac = lambda v: f"{v:.0%}" if v is not None else "-"  # noqa: E731
        c = row["config"]
        print(f"{num_tokens:>6} {'ok' if row['ok'] else 'FAIL':>5} {row['us']:>9.1f} {row['ref_us']:>9.1f} "
              f"{row['experts_read']:>7.1f} {row['weight_gbs']:>6.0f} {frac(row['frac_of_copy']):>7} "
              f"{row['tflops']:>7.1f} {frac(row['frac_of_matmul']):>6}   {row['route_us']:>6.1f} "
              f"{row['align_us']:>6.1f} {row['gate_up_us']:>8.1f} {row['down_us']:>8.1f}  "
              f"{c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} g{c['GROUP_M']} w{c['num_warps']} s{c['num_stages']}")

    if args.sweep and cuda:
        result["sweep"] = sweep(shape, experts, token_counts)

    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.json_out}")
    return 0 if all(row["ok"] for row in result["layer"]) else 1


if __name__ == "__main__":
    sys.exit(main())
