"""FP8 linear layers: e4m3 weights with one float32 scale per output channel, activations quantized per token.

y = (x_q * x_scale) @ (w_q * w_scale).T + bias. On a device with FP8 GEMMs (CUDA compute capability 8.9 and up) the
product runs in torch._scaled_mm, accumulated in the tensor cores' fast FP8 accumulator; on the CPU the same
arithmetic is emulated, accumulated in float32. A token's scale maps its absolute maximum to e4m3's largest value, or,
under an absmax_bound (fbgemm_fp8's activation_scale_ub), the smaller of the two: larger elements saturate.
"""
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_MIN_SCALE = 1e-12  # an all-zero row or token gets this scale instead of zero
QUANTIZED_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")

Fp8Gemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
RowQuantizer = Callable[[torch.Tensor, int | None, float | None], tuple[torch.Tensor, torch.Tensor]]


class Fp8Linear(nn.Module):
    """weight: [out, in] e4m3; weight_scale: [out] float32, so that weight * weight_scale[:, None] is the real one."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=FP8), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(out_features, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale in e4m3, computed in float32 and clamped to e4m3's range (scale broadcasts against x)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_rows(x: torch.Tensor, rows_out: int | None = None,
                  absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q e4m3, scale float32 [rows]) with x ≈ x_q * scale[:, None]: each row's absolute maximum, clipped to
    absmax_bound when given, maps to FP8_MAX. rows_out pads x with rows of zeros to that many rows."""
    x = x if rows_out is None else F.pad(x, (0, 0, 0, rows_out - x.shape[0]))
    absmax = x.float().abs().amax(dim=-1)
    if absmax_bound is not None:
        absmax = absmax.clamp_max(absmax_bound)
    scale = (absmax / FP8_MAX).clamp_min(_MIN_SCALE)
    return to_fp8(x, scale[:, None]), scale


def dequantize_rows(x_q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (x_q.float() * scale[:, None]).to(dtype)


def emulated_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        bias: torch.Tensor | None, absmax_bound: float | None = None) -> torch.Tensor:
    """torch._scaled_mm's arithmetic in float32: the CPU path and the reference of the FP8 GEMM."""
    x_q, x_scale = quantize_rows(x, absmax_bound=absmax_bound)
    y = (x_q.float() @ weight.float().T) * x_scale[:, None] * weight_scale[None, :]
    return (y if bias is None else y + bias.float()).to(x.dtype)


def scaled_mm_rows(rows: int) -> int:
    """The rows an FP8 GEMM of `rows` rows runs at. From 385 rows on, cuBLAS picks slow row-wise FP8 kernels just
    past multiples of 128, so GEMMs of 385 to 1,024 rows (the range measured) run padded to a multiple of 128. H100,
    fast accumulation, Llama-3.1-8B's four GEMMs together: 217.6 us at 400 rows as they are, 187.4 padded (gate_up
    119.0 against 91.6); 324.7 against 297.0 at 656; padded never more than 0.7% slower. Below 385 rows
    padding pays only for qkv at 32."""
    return -(-rows // 128) * 128 if 384 < rows <= 1024 else rows


def scaled_mm_fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         bias: torch.Tensor | None, quantize: RowQuantizer = quantize_rows,
                         absmax_bound: float | None = None) -> torch.Tensor:
    """The FP8 GEMM: row-wise scales (per token x per channel), bf16 out (what row-wise scaling supports). quantize:
    quantize_rows or a kernel with its arithmetic (kernels.fp8_quant)."""
    rows = x.shape[0]
    x_q, x_scale = quantize(x, scaled_mm_rows(rows), absmax_bound)
    # NOTE: fast accumulation (the FP8 tensor cores' accumulator, not promoted to float32 every few k-steps):
    # Llama-3.1-8B's GEMMs at 400 rows 18-40% faster and at 8,192 rows 8-12% (H100), 400 x 1,000/1,000 tokens
    # 11,460 -> 12,136 output tok/s; outputs within 2-4e-3 (relative) of the promoted accumulation's.
    y = torch._scaled_mm(x_q, weight.T, scale_a=x_scale[:, None], scale_b=weight_scale[None, :],
                         out_dtype=torch.bfloat16, use_fast_accum=True)[:rows]
    return (y if bias is None else y + bias).to(x.dtype)


def fp8_gemm_for(device: torch.device, quantize: RowQuantizer = quantize_rows,
                 absmax_bound: float | None = None) -> Fp8Gemm:
    """The FP8 GEMM of a device: emulated on the CPU, torch._scaled_mm on a GPU that has FP8, its activations
    quantized by `quantize` (under absmax_bound); any other device fails here, at start."""
    if device.type == "cpu":
        return partial(emulated_fp8_linear, absmax_bound=absmax_bound)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        return partial(scaled_mm_fp8_linear, quantize=quantize, absmax_bound=absmax_bound)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    raise RuntimeError(f"quantization fp8 needs FP8 GEMMs (CUDA compute capability 8.9+, e.g. Ada or Hopper) or the "
                       f"CPU's emulation; {device} ({name}) has neither")


def quantize_linear_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The worker-layout state of an unquantized checkpoint with every decoder linear layer's weight in e4m3 plus its
    per-channel weight_scale."""
    quantized = dict(state)
    for name, tensor in state.items():
        if name.endswith(".weight") and name.removesuffix(".weight").endswith(QUANTIZED_LINEARS):
            quantized[name], quantized[name.removesuffix("weight") + "weight_scale"] = quantize_rows(tensor)
    return quantized


def keep_stored_precision(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """In place, before the state is loaded: each Fp8Linear whose weight the state holds unquantized (a layer that a
    pre-quantized checkpoint's ignore list kept in its float type) becomes an nn.Linear on the same device."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Fp8Linear) and state[f"{name}.weight"].dtype != FP8:
            out_features, in_features = module.weight.shape
            model.set_submodule(name, nn.Linear(in_features, out_features, module.bias is not None,
                                                device=module.weight.device))
