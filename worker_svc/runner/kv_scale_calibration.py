"""`--calculate-kv-scales`: an FP8 KV cache's per-layer scales taken from the first step the worker runs, for a
checkpoint that carries none, whose keys or values may leave e4m3's range at a scale of 1.0.

Each attention layer sees that step's keys (normed and rotated, as the cache stores them) and values before it
stores them, and sets its k_scale / v_scale in place, so the CUDA graphs captured with the old ones read the new
ones. The first step's absolute maximum maps to a fraction of e4m3's range, leaving room for larger later tokens."""
import logging
from collections.abc import Callable
from typing import TypeVar

import torch

from sluice.worker.models.decoder import Attention
from sluice.worker.ops.fp8 import FP8_MAX
from sluice.worker.ops.plain_torch import TorchOps

log = logging.getLogger("sluice.worker")
KEY_HEADROOM = 2.0  # keys may grow to twice the first step's absolute maximum before they are clipped
VALUE_HEADROOM = 4.0
_MIN_SCALE = 1e-6  # a layer whose first keys or values are all zero

Result = TypeVar("Result")


def with_calculated_kv_scales(model: torch.nn.Module, first_step: Callable[[], Result]) -> Result:
    """Runs the first step eagerly (model.hidden_states), each attention layer setting its scales before it stores
    its keys and values."""
    hooks = [layer.self_attn.register_forward_pre_hook(_set_kv_scales) for layer in model.layers]
    try:
        result = first_step()
    finally:
        for hook in hooks:
            hook.remove()
    k_scales, v_scales = (torch.stack([getattr(layer.self_attn, name) for layer in model.layers]).tolist()
                          for name in ("k_scale", "v_scale"))
    log.info("FP8 KV-cache scales from the first step: keys %.3g to %.3g, values %.3g to %.3g", min(k_scales),
             max(k_scales), min(v_scales), max(v_scales))
    return result


def _set_kv_scales(attention: Attention, args: tuple) -> None:
    qkv, positions, cos_sin_cache = args[:3]
    _, k, v = TorchOps.rotated_qkv(attention.heads(qkv), positions, cos_sin_cache, *attention.qk_norms,
                                   attention.num_kv_heads, attention.gemma_norm)
    for scale, x, headroom in ((attention.k_scale, k, KEY_HEADROOM), (attention.v_scale, v, VALUE_HEADROOM)):
        scale.copy_((x.abs().amax().float() * headroom / FP8_MAX).clamp_min(_MIN_SCALE))
