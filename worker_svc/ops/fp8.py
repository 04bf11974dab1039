"""FP8 linear layers: e4m3 weights with one float32 scale per output channel, activations quantized per token.

y = (x_q * x_scale) @ (w_q * w_scale).T + bias (fp8_gemm.py runs it). A token's scale maps its absolute maximum to
e4m3's largest value, or, under an absmax_bound (fbgemm_fp8's activation_scale_ub), the smaller of the two: larger
elements saturate. A mixture's experts (models/moe.py) are e4m3 with a scale per row too, or with a scale per block
of a block-wise checkpoint, whose activations are quantized per token in groups of a block's columns.
"""
import torch
import torch.nn.functional as F
from torch import nn

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_MIN_SCALE = 1e-12  # an all-zero row or token gets this scale instead of zero
QUANTIZED_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj",
                     "mlp.shared_expert.gate_up_proj", "mlp.shared_expert.down_proj")
QUANTIZED_EXPERTS = ("mlp.experts.w13", "mlp.experts.w2")  # [experts, rows, columns], each expert's rows scaled


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


def quantize_row_groups(x: torch.Tensor, group: int,
                        absmax_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_q e4m3 [rows, columns], scale float32 [rows, ceil(columns / group)]): each row's groups of `group` columns
    (the last one cut) quantized as quantize_rows quantizes a row."""
    rows, columns = x.shape
    x_q, scale = quantize_rows(F.pad(x, (0, -columns % group)).reshape(-1, group), absmax_bound=absmax_bound)
    return x_q.reshape(rows, -1)[:, :columns], scale.reshape(rows, -1)


def dequantize_blocks(x_q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """float32 x_q [rows, columns] times the scale [ceil(rows / block rows), ceil(columns / block columns)] of the
    block each element lies in (the blocks at the edges cut)."""
    rows, columns = x_q.shape
    return x_q.float() * scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :columns]


def quantize_linear_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The worker-layout state of an unquantized checkpoint with every decoder linear layer's weight in e4m3 plus its
    per-channel weight_scale, and every layer's stacked experts (w13, w2) in e4m3 plus their per-row scales
    (w13_scale, w2_scale). Routers and a shared expert's gate keep their float weights (models/moe.py); so do the
    embedding, the LM head and a vision tower, outside the decoder layers.
    In place, a weight at a time: each float weight is freed once quantized, so a model that fills the device in
    bf16 (Qwen3-30B-A3B on 80 GB) quantizes there."""
    for name in list(state):
        if not name.startswith("layers."):
            continue
        if name.endswith(".weight") and name.removesuffix(".weight").endswith(QUANTIZED_LINEARS):
            state[name], state[name.removesuffix("weight") + "weight_scale"] = quantize_rows(state[name])
        elif name.endswith(QUANTIZED_EXPERTS):
            state[name], state[f"{name}_scale"] = _quantize_experts(state[name])
    return state


def _quantize_experts(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 [experts, rows, columns], float32 scales [experts, rows]): each expert's rows as quantize_rows quantizes
    them, one expert at a time (a float32 copy of one expert, not of the layer's)."""
    values = torch.empty(weights.shape, dtype=FP8, device=weights.device)
    scales = torch.empty(weights.shape[:2], dtype=torch.float32, device=weights.device)
    for expert, weight in enumerate(weights):
        values[expert], scales[expert] = quantize_rows(weight)
    return values, scales


def keep_stored_precision(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """In place, before the state is loaded: each Fp8Linear whose weight the state holds unquantized (a layer that a
    pre-quantized checkpoint's ignore list kept in its float type) becomes an nn.Linear on the same device."""
    for name, module in list(model.named_modules()):
        if isinstance(module, Fp8Linear) and state[f"{name}.weight"].dtype != FP8:
            out_features, in_features = module.weight.shape
            model.set_submodule(name, nn.Linear(in_features, out_features, module.bias is not None,
                                                device=module.weight.device))
