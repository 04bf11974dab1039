"""gpt-oss's experts as transformers stores them, stacked per layer (gate_up_proj [experts, hidden, 2 * intermediate]
with gate and up columns interleaved, gate_up_proj_bias, down_proj [experts, intermediate, hidden], down_proj_bias)
behind a biased router, put in the worker's layout (models/moe.py's Experts, with biases)."""
import torch

from sluice.worker.models.config import ModelConfig


def arrange_stacked_experts(state: dict[str, torch.Tensor], prefix: str) -> None:
    """In place: the layer's (rank's columns of its) stacked experts as mlp.experts.w13 and w13_bias, each expert's
    gate rows then its up rows, and w2 [experts, hidden, intermediate] with w2_bias."""
    experts = f"{prefix}mlp.experts."
    gate_up = state.pop(f"{experts}gate_up_proj").transpose(1, 2)  # [experts, 2 * intermediate, hidden]
    gate_up_bias = state.pop(f"{experts}gate_up_proj_bias")
    state[f"{experts}w13"] = torch.cat([gate_up[:, ::2], gate_up[:, 1::2]], dim=1)
    state[f"{experts}w13_bias"] = torch.cat([gate_up_bias[:, ::2], gate_up_bias[:, 1::2]], dim=1)
    state[f"{experts}w2"] = state.pop(f"{experts}down_proj").transpose(1, 2).contiguous()
    state[f"{experts}w2_bias"] = state.pop(f"{experts}down_proj_bias")


def stacked_expert_shapes(config: ModelConfig, layer_prefix: str) -> dict[str, tuple[int, ...]]:
    """The Hugging Face names and shapes of a layer's router and stacked experts."""
    experts, hidden, intermediate = config.moe.num_experts, config.hidden_size, config.moe.intermediate_size
    prefix = f"{layer_prefix}mlp."
    return {f"{prefix}router.weight": (experts, hidden), f"{prefix}router.bias": (experts,),
            f"{prefix}experts.gate_up_proj": (experts, hidden, 2 * intermediate),
            f"{prefix}experts.gate_up_proj_bias": (experts, 2 * intermediate),
            f"{prefix}experts.down_proj": (experts, intermediate, hidden),
            f"{prefix}experts.down_proj_bias": (experts, hidden)}
