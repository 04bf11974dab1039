"""The FP8 path's row kernels and decode attention at a model's shapes, on a CUDA GPU:
`python -P benchmarks/fp8_kernels.py [--model Llama-3.1-8B] [--seqs 400] [--context 1000 2000]`.

- The kernels that quantize activations per row (`rms_norm_fp8` with its residual add, `act_and_mul_fp8`,
  `quantize_rows_fp8`) at 1 to 8,192 rows of the model's widths, each first checked bit for bit against the unfused
  kernel followed by `quantize_rows_fp8`: us and GB/s of bytes read once plus written.
- Decode attention over an FP8 cache of 16-token blocks in shuffled order, one row a program and as the decode
  graphs launch it (row_groups of one row, up to rows_per_program rows a program), checked equal: us and GB/s of
  K/V read.
Median of CUDA-graph replays.
"""
import argparse

import torch
import triton
import triton.testing

from sluice.kernels import act_and_mul_fp8, fused_add_rms_norm, paged_decode_attention, rms_norm_fp8, silu_and_mul
from sluice.kernels.fp8_quant import quantize_rows_fp8, quantize_rows_fp8_ref
from sluice.kernels.kv_quant import KV_FP8
from sluice.worker.loading.shapes import shape_config
from sluice.worker.models.config import ModelConfig
from sluice.worker.ops.attention_metadata import rows_per_program

DTYPE = torch.bfloat16
ROWS = (1, 64, 400, 2048, 8192)
BLOCK_SIZE = 16


def graph_us(fn) -> float:
    return 1000 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def same_rows(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


def row_kernels(config: ModelConfig) -> None:
    hidden, inter = config.hidden_size, config.intermediate_size
    norm_weight = torch.rand(hidden, device="cuda", dtype=DTYPE) + 0.5
    print("| rows | kernel | us | GB/s |\n| ---: | --- | ---: | ---: |")
    for rows in ROWS:
        x, residual = (torch.randn(rows, hidden, device="cuda", dtype=DTYPE) for _ in range(2))
        gate_up = torch.randn(rows, 2 * inter, device="cuda", dtype=DTYPE) * 3
        cases = [
            ("rms_norm_fp8", lambda: rms_norm_fp8(x, residual, norm_weight, 1e-5)[:2],
             lambda: quantize_rows_fp8(fused_add_rms_norm(x, residual, norm_weight, 1e-5)[0]), rows * hidden * 7),
            ("silu_and_mul_fp8", lambda: act_and_mul_fp8(gate_up, "silu"),
             lambda: quantize_rows_fp8(silu_and_mul(gate_up)), rows * inter * 5),
            ("quantize_rows_fp8", lambda: quantize_rows_fp8(x), lambda: quantize_rows_fp8_ref(x), rows * hidden * 3),
        ]
        for name, fused, unfused, nbytes in cases:
            if not same_rows(fused(), unfused()):
                raise AssertionError(f"{name} at {rows} rows differs from the unfused kernels")
            us = graph_us(fused)
            print(f"| {rows:,} | {name} | {us:.1f} | {nbytes / us / 1e3:,.0f} |", flush=True)


def decode_attention(config: ModelConfig, num_seqs: int, context: tuple[int, int]) -> None:
    lens = torch.randint(context[0], context[1] + 1, (num_seqs,)).tolist()
    blocks = [triton.cdiv(n, BLOCK_SIZE) for n in lens]
    stored = (sum(blocks), config.num_kv_heads, BLOCK_SIZE, config.head_dim)  # head-major, as the worker stores it
    key_cache, value_cache = (torch.randn(stored, device="cuda").to(KV_FP8).transpose(1, 2) for _ in range(2))
    order = torch.randperm(stored[0], device="cuda", dtype=torch.int32).split(blocks)
    block_tables = torch.nn.utils.rnn.pad_sequence(list(order), batch_first=True)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    query = torch.randn(num_seqs, config.num_heads, config.head_dim, device="cuda", dtype=DTYPE)
    scales = dict(k_scale=torch.ones((), device="cuda"), v_scale=torch.ones((), device="cuda"))
    grouped = dict(row_groups=torch.ones(num_seqs, dtype=torch.int32, device="cuda"),
                   max_group_rows=rows_per_program(config.num_heads, config.num_kv_heads))
    nbytes = sum(lens) * config.num_kv_heads * config.head_dim * 2
    print(f"\ndecode attention, {num_seqs} sequences of {context[0]:,}-{context[1]:,} tokens, FP8 cache\n"
          "| launch | us | GB/s of K/V |\n| --- | ---: | ---: |")
    alone = paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, config.head_dim ** -0.5,
                                   **scales)
    for name, options in (("one row a program", {}), ("the decode graphs' (grouped rows)", grouped)):
        def attend(options=options):
            return paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                          config.head_dim ** -0.5, **scales, **options)
        if not torch.equal(attend(), alone):
            raise AssertionError(f"{name} differs from one row a program")
        us = graph_us(attend)
        print(f"| {name} | {us:.1f} | {nbytes / us / 1e3:,.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="Llama-3.1-8B", help="a model shape")
    parser.add_argument("--seqs", type=int, default=400, help="decode attention's sequences")
    parser.add_argument("--context", type=int, nargs=2, default=(1000, 2000), metavar=("MIN", "MAX"))
    args = parser.parse_args()
    torch.manual_seed(0)
    config = ModelConfig.from_hf(shape_config(args.model))
    row_kernels(config)
    decode_attention(config, args.seqs, tuple(args.context))


if __name__ == "__main__":
    main()
