"""The FP8 GEMM of fp8.Fp8Linear layers: activations quantized per row (fp8.quantize_rows, or a kernel with its
arithmetic), then multiplied by the e4m3 weight. On a device with FP8 GEMMs (CUDA compute capability 8.9 and up) the
product runs in torch._scaled_mm, accumulated in the tensor cores' fast FP8 accumulator; on the CPU the same
arithmetic is emulated, accumulated in float32. A kernel that produces the activations (a norm, the MLP's gate) may
quantize them itself and hand the product QuantizedRows. In plain torch, the experts of a block-wise checkpoint
multiply as emulated_block_fp8_linear computes it.
"""
import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from sluice.worker.ops.fp8 import dequantize_blocks, quantize_row_groups, quantize_rows

RowQuantizer = Callable[[torch.Tensor, int | None, float | None], tuple[torch.Tensor, torch.Tensor]]


class QuantizedRows(NamedTuple):
    """Activations quantized per row: values [padded rows, K] e4m3 and scales [padded rows] float32, of which the first
    `rows` are real (zero rows after them pad a GEMM to a row count its library runs faster); dtype is the
    activations' own, which the product returns."""
    values: torch.Tensor
    scales: torch.Tensor
    rows: int
    dtype: torch.dtype


def emulated_fp8_product(x: QuantizedRows, weight: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None) -> torch.Tensor:
    """torch._scaled_mm's arithmetic in float32: the CPU path and the reference of the FP8 GEMM."""
    y = (x.values[:x.rows].float() @ weight.float().T) * x.scales[:x.rows, None] * weight_scale[None, :]
    return (y if bias is None else y + bias.float()).to(x.dtype)


def scaled_mm_fp8_product(x: QuantizedRows, weight: torch.Tensor, weight_scale: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
    """Row-wise scales (per token x per channel), bf16 out (what row-wise scaling supports)."""
    # NOTE: fast accumulation (the FP8 tensor cores' accumulator, not promoted to float32 every few k-steps):
    # Llama-3.1-8B's GEMMs at 400 rows 18-40% faster and at 8,192 rows 8-12% (H100), 400 x 1,000/1,000 tokens
    # 11,460 -> 12,136 output tok/s; outputs within 2-4e-3 (relative) of the promoted accumulation's.
    y = torch._scaled_mm(x.values, weight.T, scale_a=x.scales[:, None], scale_b=weight_scale[None, :],
                         out_dtype=torch.bfloat16, use_fast_accum=True)[:x.rows]
    return (y if bias is None else y + bias).to(x.dtype)


def emulated_block_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                              block: tuple[int, int], absmax_bound: float | None = None) -> torch.Tensor:
    """x @ weight.T in x's dtype for an e4m3 weight with a float32 scale per block of `block` (rows, columns), as
    vLLM's block-wise FP8 GEMM computes it: x's rows quantized in groups of the block's columns, both operands
    dequantized and multiplied in float32."""
    x_q, x_scale = quantize_row_groups(x, block[1], absmax_bound)
    x_real = dequantize_blocks(x_q, x_scale, (1, block[1]))
    return F.linear(x_real, dequantize_blocks(weight, weight_scale, block)).to(x.dtype)


def unpadded_rows(rows: int) -> int:
    return rows


def scaled_mm_rows(rows: int) -> int:
    """The rows an FP8 GEMM of `rows` rows runs at. From 385 rows on, cuBLAS picks slow row-wise FP8 kernels just
    past multiples of 128, so GEMMs of 385 to 1,024 rows (the range measured) run padded to a multiple of 128. H100,
    fast accumulation, Llama-3.1-8B's four GEMMs together: 217.6 us at 400 rows as they are, 187.4 padded (gate_up
    119.0 against 91.6); 324.7 against 297.0 at 656; padded never more than 0.7% slower. Below 385 rows
    padding pays only for qkv at 32."""
    return -(-rows // 128) * 128 if 384 < rows <= 1024 else rows


@dataclasses.dataclass(frozen=True)
class Fp8Gemm:
    """y = gemm(x, weight, weight_scale, bias): x's rows quantized by `quantize` under absmax_bound, padded to
    padded_rows(rows), then multiplied by `product`."""
    product: Callable[[QuantizedRows, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    padded_rows: Callable[[int], int] = unpadded_rows
    quantize: RowQuantizer = quantize_rows
    absmax_bound: float | None = None

    def quantize_options(self, rows: int) -> dict:
        """How `rows` rows of activations are quantized for this GEMM, here or by a kernel that produces them."""
        return dict(rows_out=self.padded_rows(rows), absmax_bound=self.absmax_bound)

    def quantized(self, x: torch.Tensor) -> QuantizedRows:
        values, scales = self.quantize(x, **self.quantize_options(x.shape[0]))
        return QuantizedRows(values, scales, x.shape[0], x.dtype)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
        return self.product(self.quantized(x), weight, weight_scale, bias)


emulated_fp8_linear = Fp8Gemm(emulated_fp8_product)
scaled_mm_fp8_linear = Fp8Gemm(scaled_mm_fp8_product, scaled_mm_rows)


def fp8_gemm_for(device: torch.device, quantize: RowQuantizer = quantize_rows,
                 absmax_bound: float | None = None) -> Fp8Gemm:
    """The FP8 GEMM of a device: emulated on the CPU with torch's quantization, torch._scaled_mm on a GPU that has
    FP8 with its activations quantized by `quantize` (a kernel: Triton's interpreter rounds FP8 stores wrongly, so
    not on the CPU), both under absmax_bound; any other device fails here, at start."""
    if device.type == "cpu":
        return dataclasses.replace(emulated_fp8_linear, absmax_bound=absmax_bound)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        return dataclasses.replace(scaled_mm_fp8_linear, quantize=quantize, absmax_bound=absmax_bound)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    raise RuntimeError(f"quantization fp8 needs FP8 GEMMs (CUDA compute capability 8.9+, e.g. Ada or Hopper) or the "
                       f"CPU's emulation; {device} ({name}) has neither")
