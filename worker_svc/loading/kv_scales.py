"""The per-layer scales of an FP8 KV cache, as vLLM reads them from a checkpoint: layers.N.self_attn.k_scale and
v_scale, k_proj.output_scale and v_proj.output_scale, k_proj.k_scale and v_proj.v_scale (ModelOpt's), or one kv_scale
for both (AutoFP8's first layout); 1.0 where the checkpoint has none."""
import torch

_CHECKPOINT_NAMES = {
    "k_scale": ("self_attn.k_scale", "self_attn.k_proj.output_scale", "self_attn.k_proj.k_scale", "self_attn.kv_scale"),
    "v_scale": ("self_attn.v_scale", "self_attn.v_proj.output_scale", "self_attn.v_proj.v_scale", "self_attn.kv_scale"),
}


def with_kv_scales(state: dict[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """The worker-layout state with every layer's self_attn.k_scale and v_scale as float32 scalars."""
    checkpoint_names = {f"layers.{layer}.{name}" for layer in range(num_layers)
                        for names in _CHECKPOINT_NAMES.values() for name in names}
    scales = {}
    for layer in range(num_layers):
        for buffer, names in _CHECKPOINT_NAMES.items():
            found = [state[f"layers.{layer}.{name}"] for name in names if f"layers.{layer}.{name}" in state]
            scales[f"layers.{layer}.self_attn.{buffer}"] = found[0].float().reshape(()) if found else torch.ones(())
    return {name: tensor for name, tensor in state.items() if name not in checkpoint_names} | scales
