"""FP8 linear layers: e4m3 weights with one float32 scale per output channel, activations quantized per token.

y = (x_q * x_scale) @ (w_q * w_scale).T + bias (fp8_gemm.py runs it). A token's scale maps its absolute maximum to
e4m3's largest value, or, under an absmax_bound (fbgemm_fp8's activation_scale_ub), the smaller of the two: larger
elements saturate.
"""
import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_MIN_SCALE = 1e-12  # an all-zero row or token gets this scale instead of zero
QUANTIZED_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


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
