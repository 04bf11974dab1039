"""Each row's largest logit and its first index on a GPU: torch.max(dim=-1) against kernels.row_max, float32 logits
of batch-1 and batched greedy steps, median of CUDA-graph replays: `python -P benchmarks/row_max.py`."""
import torch
import triton.testing

from sluice.kernels.row_max import row_max, row_max_ref

SHAPES = [(1, 128256), (1, 151936), (16, 128256), (64, 151936), (256, 151936)]


def main() -> None:
    print("| rows x vocabulary | torch.max (us) | row_max (us) |\n| --- | ---: | ---: |")
    for shape in SHAPES:
        logits = torch.randn(shape, device="cuda") * 4
        assert all(torch.equal(a, b) for a, b in zip(row_max(logits), row_max_ref(logits)))
        times = [triton.testing.do_bench_cudagraph(lambda f=f: f(logits), rep=200, return_mode="median") * 1e3
                 for f in (row_max_ref, row_max)]
        print(f"| {shape[0]} x {shape[1]:,} | {times[0]:.1f} | {times[1]:.1f} |")


if __name__ == "__main__":
    main()
