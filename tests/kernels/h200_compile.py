"""Compiles the sampling and logprob kernels for the H200 (sm_90) with Triton's own ptxas, no GPU needed, and
prints one line per variant: `python tests/kernels/h200_compile.py` (without TRITON_INTERPRET, under which
@triton.jit makes interpreted functions that do not compile)."""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sluice.kernels.candidate_draw import _candidate_draw_kernel
from sluice.kernels.logprob_stats import _chunk_stats_kernel, _row_stats_kernel
from sluice.kernels.seeded_uniform import _seeded_uniform_kernel
from sluice.kernels.threshold_search import _threshold_search_kernel
from sluice.kernels.weighted_draw import _chunk_sums_kernel, _draw_kernel

H200 = GPUTarget("cuda", 90, 32)
SEEDED_UNIFORM = {"seeds_ptr": "*i64", "positions_ptr": "*i64", "out_ptr": "*fp64", "num_rows": "i32",
                  "seed_stride": "i32", "seed_word_stride": "i32", "position_stride": "i32"}
CANDIDATE_DRAW = {
    "values_ptr": "*fp32", "ids_ptr": "*i64", "probs_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32",
    "min_p_ptr": "*fp32", "uniform_ptr": "*fp64", "scratch_ptr": "*i64", "out_ptr": "*i64", "width": "i32",
    "row_stride": "i32", "top_k_stride": "i32", "top_p_stride": "i32", "min_p_stride": "i32",
}

LOGPROB_STATS = {"logits_ptr": "*fp32", "token_ids_ptr": "*i64", "max_ptr": "*fp32", "sum_ptr": "*fp32",
                 "above_ptr": "*i32", "top_values_ptr": "*fp32", "top_ids_ptr": "*i64", "vocab": "i32",
                 "row_stride": "i32"}
ROW_STATS = {"max_ptr": "*fp32", "sum_ptr": "*fp32", "above_ptr": "*i32", "top_values_ptr": "*fp32",
             "top_ids_ptr": "*i64", "normaliser_ptr": "*fp32", "rank_ptr": "*i64", "values_out_ptr": "*fp32",
             "ids_out_ptr": "*i64", "num_chunks": "i32", "vocab": "i32"}

THRESHOLD_SEARCH = {"keys_ptr": "*i32", "weights_ptr": "*i64", "limit_ptr": "*i64", "key_out_ptr": "*i64",
                    "above_out_ptr": "*i64", "tied_out_ptr": "*i64", "count_out_ptr": "*i64", "n": "i32",
                    "keys_row_stride": "i32",
                    "weights_row_stride": "i32"}

CHUNK_SUMS = {"weights_ptr": "*i64", "keys_ptr": "*i32", "probs_ptr": "*fp32", "last_ptr": "*i64",
              "min_p_ptr": "*fp32", "temperature_ptr": "*fp32", "maxima_ptr": "*fp32", "above_sums_ptr": "*i64",
              "tie_counts_ptr": "*i64", "tie_sums_ptr": "*i64", "n": "i32", "weights_row_stride": "i32",
              "keys_row_stride": "i32", "probs_row_stride": "i32", "min_p_stride": "i32", "temperature_stride": "i32"}
DRAW = {"weights_ptr": "*i64", "keys_ptr": "*i32", "probs_ptr": "*fp32", "last_ptr": "*i64", "ties_kept_ptr": "*i64",
        "min_p_ptr": "*fp32", "temperature_ptr": "*fp32", "maxima_ptr": "*fp32", "uniform_ptr": "*fp64",
        "above_sums_ptr": "*i64", "tie_counts_ptr": "*i64", "tie_sums_ptr": "*i64", "out_ptr": "*i64", "n": "i32",
        "num_chunks": "i32", "weights_row_stride": "i32", "keys_row_stride": "i32", "probs_row_stride": "i32",
        "min_p_stride": "i32", "temperature_stride": "i32"}


def compiled_ptx(kernel, signature: dict[str, str], constexprs: dict, num_warps: int) -> str:
    signature = signature | dict.fromkeys(constexprs, "constexpr")
    source = ASTSource(kernel, signature, constexprs)
    return triton.compile(source, target=H200, options={"num_warps": num_warps}).asm["ptx"]


def main() -> None:
    for stream_type in ("i32", "u32"):  # Triton types an int argument by its value
        ptx = compiled_ptx(_seeded_uniform_kernel, SEEDED_UNIFORM | {"stream": stream_type}, {"BLOCK": 128}, 4)
        print(f"seeded_uniform stream {stream_type}: {len(ptx)} bytes of PTX")
    for top_p in (False, True):
        for min_p in (False, True):
            constexprs = {"HAS_TOP_K": True, "HAS_TOP_P": top_p, "HAS_MIN_P": min_p, "BLOCK": 1024, "CHUNK": 16}
            ptx = compiled_ptx(_candidate_draw_kernel, CANDIDATE_DRAW, constexprs, 8)
            print(f"candidate_draw top_p {top_p} min_p {min_p}: {len(ptx)} bytes of PTX, "
                  f"{'spills to local memory' if '.local' in ptx else 'no spills'}")
    for num_top in (0, 5, 20):
        top = {"NUM_TOP": num_top, "TOP_BLOCK": triton.next_power_of_2(max(num_top, 1))}
        chunks = compiled_ptx(_chunk_stats_kernel, LOGPROB_STATS, top | {"CHUNK": 4096}, 4)
        rows = compiled_ptx(_row_stats_kernel, ROW_STATS, top | {"CHUNKS": 64}, 4)
        print(f"logprob_stats num_top {num_top}: {len(chunks)} and {len(rows)} bytes of PTX")
    variants = [("weighted_draw of i64", "*i64", False, False), ("tempered_draw", "*fp32", False, False)]
    variants += [(f"nucleus_draw top_p {top_p} min_p {min_p}", "*i64", top_p, min_p)
                 for top_p, min_p in ((True, False), (True, True), (False, True))]
    for name, weights_type, top_p, min_p in variants:
        variant = {"FROM_LOGITS": weights_type == "*fp32", "HAS_TOP_P": top_p, "HAS_MIN_P": min_p, "CHUNK": 2048}
        sums = compiled_ptx(_chunk_sums_kernel, CHUNK_SUMS | {"weights_ptr": weights_type}, variant, 8)
        draw = compiled_ptx(_draw_kernel, DRAW | {"weights_ptr": weights_type}, variant | {"CHUNKS": 128}, 8)
        print(f"{name}: {len(sums)} and {len(draw)} bytes of PTX")
    for weighted in (True, False):
        ptx = compiled_ptx(_threshold_search_kernel, THRESHOLD_SEARCH, {"HAS_WEIGHTS": weighted, "BLOCK": 512}, 8)
        print(f"threshold_search {'weighted' if weighted else 'counting'}: {len(ptx)} bytes of PTX, "
              f"{'spills to local memory' if '.local' in ptx else 'no spills'}")


if __name__ == "__main__":
    main()
