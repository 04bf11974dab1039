"""Each tensor-parallel rank loads only its shards: safetensors read by slices, GGUF dequantised then sliced, and
random weights drawn per shard all give the slice of the whole model's weights that the rank's layout names."""
import pytest
import torch

from sluice.cli.model_store import default_gguf_path
from sluice.worker.loading.dummy_weights import dummy_checkpoint, random_state_dict
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.shard_layout import FUSED_PROJECTIONS, ShardLayout
from tests.worker.test_model_families import _TINY, FAMILIES

RANK, WORLD_SIZE = 2, 3  # the last rank of SmolLM2's 3: the shortest vocabulary split would be padded


def _assert_same_state(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def _sharded(config: ModelConfig, whole_hf_state: dict[str, torch.Tensor], rank: int = RANK,
             world_size: int = WORLD_SIZE) -> dict[str, torch.Tensor]:
    layout = ShardLayout(config, rank, world_size)
    return to_worker_layout({name: layout.shard(name, t) for name, t in whole_hf_state.items()}, config)


def test_safetensors_and_gguf_load_the_ranks_slices(default_model_dir):
    from safetensors.torch import load_file

    config, whole = load_checkpoint(default_model_dir)
    whole_hf = load_file(next(default_model_dir.glob("*.safetensors")))
    expected = _sharded(config, whole_hf)
    _, from_folder = load_checkpoint(default_model_dir, RANK, WORLD_SIZE)
    _assert_same_state(from_folder, expected)
    assert from_folder["layers.0.self_attn.qkv_proj.weight"].shape == (5 * 64, 576)  # 3 q heads, 1 k, 1 v
    assert from_folder["embed_tokens.weight"].shape == (49152 // 3, 576)
    _, from_gguf = load_checkpoint(default_gguf_path(default_model_dir.parents[1]), RANK, WORLD_SIZE)
    _assert_same_state(from_gguf, expected)


def test_random_weights_are_drawn_per_shard():
    hf_config, whole = dummy_checkpoint("SmolLM2-135M", torch.float32, torch.device("cpu"), seed=3)
    _, shard = dummy_checkpoint("SmolLM2-135M", torch.float32, torch.device("cpu"), 3, rank=1, world_size=3)
    layout = ShardLayout(ModelConfig.from_hf(hf_config), 1, 3)
    _assert_same_state(shard, {name: layout.shard(name, t) for name, t in whole.items()})


@pytest.mark.parametrize("rank, world_size", [(1, 2), (3, 4)])  # at 4 ranks, each of the 2 KV heads serves two
def test_projections_published_fused_load_as_their_parts(tmp_path, rank, world_size):
    """A checkpoint that publishes q/k/v as one qkv_proj and gate/up as one gate_up_proj (as Phi-3 does) gives each
    rank the q, k and v rows (gate and up rows) that the same projections published apart give it."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    hf_config = {**_TINY, **FAMILIES["llama"]}
    apart = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=0)
    fused = dict(apart)
    for layer in range(hf_config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        for whole in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
            parts = FUSED_PROJECTIONS[whole]
            fused[f"{prefix}{whole}.weight"] = torch.cat([fused.pop(f"{prefix}{part}.weight") for part in parts])
    for folder, state in (("apart", apart), ("fused", fused)):
        (tmp_path / folder).mkdir()
        save_file(state, tmp_path / folder / "model.safetensors")
        AutoConfig.for_model(**hf_config).save_pretrained(tmp_path / folder)
    _, expected = load_checkpoint(tmp_path / "apart", rank, world_size)
    _assert_same_state(load_checkpoint(tmp_path / "fused", rank, world_size)[1], expected)
    config = ModelConfig.from_hf(hf_config)
    _assert_same_state(_sharded(config, fused, rank, world_size), expected)
