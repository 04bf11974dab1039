"""Benchmark and check the kernels on a CUDA GPU (written for an H200): `python benchmarks/kernel_timings.py OUT.json`.

First checks every kernel against its plain-torch reference at realistic bf16 shapes, then times them (median of
CUDA-graph replays, so launch overhead is excluded; the "eager" columns are plain launches with it) and prints
tables: decode attention as achieved GB/s of K/V traffic against a measured device-to-device copy (which reads and
writes, so a read-only kernel can pass 100%), with a num_splits sweep; prefill attention as TFLOP/s, with torch's
dense causal SDPA on the same shapes as a yardstick; the small kernels as GB/s. Graph replays do not flush the
60 MB L2, so data that fits in it (the small kernels, decode at batch 1) can show more than HBM bandwidth.
Everything also goes to OUT.json.
Model shape: Qwen3-0.6B-like attention (16 query heads, 8 KV heads, head_dim 128), hidden 1024, MLP 3072.
"""
import argparse
import json
import sys

import torch
import triton
import triton.testing

from sluice.kernels import (act_and_mul_ref, fused_add_rms_norm, fused_add_rms_norm_ref, paged_decode_attention,
                            paged_decode_attention_ref, paged_prefill_attention, paged_prefill_attention_ref,
                            prepare_qkv, prepare_qkv_ref, reshape_and_cache, reshape_and_cache_ref, rms_norm,
                            rotary_embedding, rotary_embedding_ref, silu_and_mul)
from sluice.kernels.kv_quant import KV_FP8
from sluice.worker.models.rope import build_cos_sin_cache

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 16, 8, 128, 16
HIDDEN, INTERMEDIATE = 1024, 3072
DTYPE = torch.bfloat16
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
DECODE_CASES = [(batch, context) for batch in (1, 64, 256) for context in (1024, 4096)]
SPLIT_SWEEP = (1, 2, 4, 8, 16, 32)
# (q_lens, seq_lens) per case: fresh prompts, and chunks after a cached prefix (chunked prefill / prefix hits)
PREFILL_CASES = {
    "1x4096 fresh": ([4096], [4096]),
    "4x2048 fresh": ([2048] * 4, [2048] * 4),
    "8x512 after 3584 cached": ([512] * 8, [4096] * 8),
}


def time_ms(fn) -> float:
    """GPU time of one call, replayed from a CUDA graph as the worker runs decode steps (no launch overhead)."""
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def eager_ms(fn) -> float:
    """Time of one call launched from Python: what a step without CUDA graphs pays, launch overhead included."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def paged_kv(seq_lens: list[int], device: str):
    """Caches with exactly the blocks the batch needs, handed out in shuffled order, stored head-major as the worker
    allocates them."""
    blocks_per_seq = [triton.cdiv(n, BLOCK_SIZE) for n in seq_lens]
    stored = (sum(blocks_per_seq), NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
    key_cache = torch.randn(stored, device=device, dtype=DTYPE).transpose(1, 2)
    value_cache = torch.randn(stored, device=device, dtype=DTYPE).transpose(1, 2)
    perm = torch.randperm(stored[0], device=device).to(torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(blocks_per_seq):
        block_tables[i, :n] = perm[start:start + n]
        start += n
    return key_cache, value_cache, block_tables, torch.tensor(seq_lens, dtype=torch.int32, device=device)


def copy_bandwidth_gbs(device: str) -> float:
    """Device-to-device copy of 2 GiB, counting bytes read plus bytes written."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / eager_ms(lambda: dst.copy_(src)) / 1e6  # a graph would replay it as a slower memcpy node


def check_correctness(device: str) -> list[dict]:
    """Each kernel against its reference at realistic bf16 shapes; returns one row per check."""
    rows = []

    def check(name, out, ref, exact=False):
        outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
        err = max((o.float() - r.float()).abs().max().item() for o, r in zip(outs, refs))
        try:
            for o, r in zip(outs, refs):
                if exact:
                    assert torch.equal(o, r)
                else:
                    torch.testing.assert_close(o, r, **BF16_TOL)
            ok = True
        except AssertionError:
            ok = False
        rows.append(dict(check=name, ok=ok, max_abs_err=err))

    scale = HEAD_DIM ** -0.5
    for batch, context in ((64, 4096), (256, 1024)):
        seq_lens = torch.randint(1, context + 1, (batch,)).tolist()
        seq_lens[0] = context
        kc, vc, bt, lens = paged_kv(seq_lens, device)
        q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        check(f"decode b{batch} ctx<={context}", paged_decode_attention(q, kc, vc, bt, lens, scale),
              paged_decode_attention_ref(q, kc, vc, bt, lens, scale))
    for name, (q_lens, seq_lens) in PREFILL_CASES.items():
        kc, vc, bt, lens = paged_kv(seq_lens, device)
        q = torch.randn(sum(q_lens), NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        qsl = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
        check(f"prefill {name}", paged_prefill_attention(q, kc, vc, bt, qsl, lens, scale),
              paged_prefill_attention_ref(q, kc, vc, bt, qsl, lens, scale))

    tokens = 4096
    kc = torch.zeros(tokens // BLOCK_SIZE * 2, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    k, v = torch.randn(2, tokens, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    slots = torch.randperm(kc.shape[0] * BLOCK_SIZE, device=device)[:tokens]
    slots[::7] = -1
    caches = [kc.clone() for _ in range(4)]
    reshape_and_cache(k, v, caches[0], caches[1], slots)
    reshape_and_cache_ref(k, v, caches[2], caches[3], slots)
    check("reshape_and_cache", (caches[0], caches[1]), (caches[2], caches[3]), exact=True)

    x, res = torch.randn(2, tokens, HIDDEN, device=device, dtype=DTYPE)
    w = torch.randn(HIDDEN, device=device, dtype=DTYPE)
    check("fused_add_rms_norm", fused_add_rms_norm(x, res, w, 1e-6), fused_add_rms_norm_ref(x, res, w, 1e-6))
    check("fused_add_rms_norm residual", fused_add_rms_norm(x, res, w, 1e-6)[1], x + res, exact=True)

    cache = build_cos_sin_cache(HEAD_DIM, 40960, 1e6, None, DTYPE).to(device)
    pos = torch.randint(0, 40960, (tokens,), device=device)
    q = torch.randn(tokens, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    q_ref, k_ref = q.clone(), k.clone()
    rotary_embedding(pos, q, k, cache)
    rotary_embedding_ref(pos, q_ref, k_ref, cache)
    check("rotary_embedding", (q, k), (q_ref, k_ref))

    qkv = torch.randn(tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    q_norm_w, k_norm_w = 1 + 0.1 * torch.randn(2, HEAD_DIM, device=device, dtype=DTYPE)
    caches = [torch.zeros_like(kc) for _ in range(4)]
    q = prepare_qkv(qkv, pos, cache, q_norm_w, k_norm_w, 1e-6, caches[0], caches[1], slots)
    q_ref = prepare_qkv_ref(qkv, pos, cache, q_norm_w, k_norm_w, 1e-6, caches[2], caches[3], slots)
    check("prepare_qkv", (q, caches[0], caches[1]), (q_ref, caches[2], caches[3]))

    x = torch.randn(tokens, 2 * INTERMEDIATE, device=device, dtype=DTYPE)
    check("silu_and_mul", silu_and_mul(x), act_and_mul_ref(x, "silu"))
    return rows


def bench_decode(device: str, copy_gbs: float) -> tuple[list[dict], list[dict]]:
    rows, sweep = [], []
    for batch, context in DECODE_CASES:
        row, splits = _decode_case(batch, context, device, copy_gbs)
        rows.append(row)
        sweep += splits
    return rows, sweep


def _decode_case(batch: int, context: int, device: str, copy_gbs: float) -> tuple[dict, list[dict]]:
    """One batch and context: bf16 and FP8 caches, then the split sweep (its caches are freed on return)."""
    scale = HEAD_DIM ** -0.5
    kc, vc, bt, lens = paged_kv([context] * batch, device)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * kc.element_size()
    moved = kv_bytes + 2 * q.numel() * q.element_size() + bt.numel() * 4
    fn = lambda: paged_decode_attention(q, kc, vc, bt, lens, scale)  # noqa: E731
    ms = time_ms(fn)
    gbs = moved / ms / 1e6
    one = torch.ones((), device=device)
    kc8, vc8 = kc.to(KV_FP8), vc.to(KV_FP8)
    fp8_ms = time_ms(lambda: paged_decode_attention(q, kc8, vc8, bt, lens, scale, k_scale=one, v_scale=one))
    row = dict(batch=batch, context=context, ms=ms, eager_ms=eager_ms(fn), gbs=gbs, frac_of_copy=gbs / copy_gbs,
               fp8_ms=fp8_ms, fp8_gbs=(moved - kv_bytes / 2) / fp8_ms / 1e6)
    sweep = []
    for splits in SPLIT_SWEEP:
        s_ms = time_ms(lambda: paged_decode_attention(q, kc, vc, bt, lens, scale, num_splits=splits))
        sweep.append(dict(batch=batch, context=context, num_splits=splits, ms=s_ms, gbs=moved / s_ms / 1e6))
    return row, sweep


def causal_flops(q_lens: list[int], seq_lens: list[int]) -> int:
    """4 * head_dim * heads per (query, visible key) pair: QK^T and PV, two FLOPs per multiply-add."""
    pairs = sum(q * (s - q) + q * (q + 1) // 2 for q, s in zip(q_lens, seq_lens))
    return 4 * HEAD_DIM * NUM_HEADS * pairs


def bench_prefill(device: str) -> list[dict]:
    rows = []
    scale = HEAD_DIM ** -0.5
    for name, (q_lens, seq_lens) in PREFILL_CASES.items():
        kc, vc, bt, lens = paged_kv(seq_lens, device)
        q = torch.randn(sum(q_lens), NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        qsl = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
        ms = time_ms(lambda: paged_prefill_attention(q, kc, vc, bt, qsl, lens, scale))
        row = dict(case=name, ms=ms, tflops=causal_flops(q_lens, seq_lens) / ms / 1e9)
        if q_lens == seq_lens and len(set(q_lens)) == 1:  # dense yardstick: torch SDPA, contiguous, causal
            dq = torch.randn(len(q_lens), NUM_HEADS, q_lens[0], HEAD_DIM, device=device, dtype=DTYPE)
            dk, dv = torch.randn(2, len(q_lens), NUM_KV_HEADS, q_lens[0], HEAD_DIM, device=device, dtype=DTYPE)
            sdpa = torch.nn.functional.scaled_dot_product_attention
            row["sdpa_ms"] = time_ms(lambda: sdpa(dq, dk, dv, is_causal=True, enable_gqa=True))
        rows.append(row)
    return rows


def bench_small(device: str) -> list[dict]:
    rows = []
    for tokens in (256, 4096):
        x, res = torch.randn(2, tokens, HIDDEN, device=device, dtype=DTYPE)
        w = torch.randn(HIDDEN, device=device, dtype=DTYPE)
        nbytes = x.numel() * x.element_size()
        cases = [
            ("rms_norm", lambda: rms_norm(x, w, 1e-6), 2 * nbytes),
            ("fused_add_rms_norm", lambda: fused_add_rms_norm(x, res, w, 1e-6), 4 * nbytes),
        ]
        gate_up = torch.randn(tokens, 2 * INTERMEDIATE, device=device, dtype=DTYPE)
        cases.append(("silu_and_mul", lambda: silu_and_mul(gate_up), gate_up.numel() * 3))  # reads 2d, writes d
        cache = build_cos_sin_cache(HEAD_DIM, 40960, 1e6, None, DTYPE).to(device)
        pos = torch.randint(0, 40960, (tokens,), device=device)
        q = torch.randn(tokens, NUM_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        k = torch.randn(tokens, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        qk_bytes = (q.numel() + k.numel()) * 2
        cases.append(("rotary_embedding", lambda: rotary_embedding(pos, q, k, cache), 2 * qk_bytes))
        kc = torch.zeros(tokens // BLOCK_SIZE * 4, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        vc = torch.zeros_like(kc)
        slots = torch.randperm(kc.shape[0] * BLOCK_SIZE, device=device)[:tokens]
        cases.append(("reshape_and_cache", lambda: reshape_and_cache(k, k, kc, vc, slots), 4 * k.numel() * 2))
        qkv = torch.randn(tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
        norm_w = torch.randn(HEAD_DIM, device=device, dtype=DTYPE)
        cases.append(("prepare_qkv", lambda: prepare_qkv(qkv, pos, cache, norm_w, norm_w, 1e-6, kc, vc, slots),
                      2 * qkv.numel() * 2))  # reads q, k, v; writes q and the cache rows
        for name, fn, moved in cases:
            ms = time_ms(fn)
            rows.append(dict(kernel=name, tokens=tokens, us=ms * 1e3, eager_us=eager_ms(fn) * 1e3,
                             gbs=moved / ms / 1e6))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_out", help="where to write the results as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/kernel_timings.py needs a CUDA device", file=sys.stderr)
        return 2
    device = "cuda"
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(device)
    result = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                  triton=triton.__version__)

    result["checks"] = check_correctness(device)
    for row in result["checks"]:
        print(f"check {row['check']:<32} {'ok' if row['ok'] else 'FAIL':<5} max abs err {row['max_abs_err']:.3g}")

    copy_gbs = result["copy_gbs"] = copy_bandwidth_gbs(device)
    print(f"\ndevice-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    result["decode"], result["decode_split_sweep"] = bench_decode(device, copy_gbs)
    print("\ndecode attention (16 q heads, 8 kv heads, head_dim 128, bf16; fp8: an e4m3 cache)")
    print(f"{'batch':>6} {'context':>8} {'ms':>8} {'eager ms':>9} {'GB/s':>6} {'of copy':>8} {'fp8 ms':>8} "
          f"{'fp8 GB/s':>8}   ms by num_splits "
          + " ".join(f"{s:>6}" for s in SPLIT_SWEEP))
    for row in result["decode"]:
        by_split = [r["ms"] for r in result["decode_split_sweep"]
                    if (r["batch"], r["context"]) == (row["batch"], row["context"])]
        print(f"{row['batch']:>6} {row['context']:>8} {row['ms']:>8.4f} {row['eager_ms']:>9.4f} {row['gbs']:>6.0f} "
              f"{row['frac_of_copy']:>8.0%} {row['fp8_ms']:>8.4f} {row['fp8_gbs']:>8.0f}   {'':>16} "
              + " ".join(f"{ms:>6.4f}" for ms in by_split))

    result["prefill"] = bench_prefill(device)
    print("\nprefill attention (causal FLOPs only)")
    print(f"{'case':<28} {'ms':>9} {'TFLOP/s':>8} {'sdpa ms':>9}")
    for row in result["prefill"]:
        sdpa = f"{row['sdpa_ms']:>9.3f}" if "sdpa_ms" in row else f"{'-':>9}"
        print(f"{row['case']:<28} {row['ms']:>9.3f} {row['tflops']:>8.0f} {sdpa}")

    result["small"] = bench_small(device)
    print("\nsmall kernels (bf16, hidden 1024, MLP 3072)")
    print(f"{'kernel':<20} {'tokens':>7} {'us':>8} {'eager us':>9} {'GB/s':>6}")
    for row in result["small"]:
        print(f"{row['kernel']:<20} {row['tokens']:>7} {row['us']:>8.1f} {row['eager_us']:>9.1f} {row['gbs']:>6.0f}")

    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.json_out}")
    return 0 if all(row["ok"] for row in result["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
