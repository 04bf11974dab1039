"""Each tensor-parallel rank loads only its shards: safetensors read by slices, GGUF dequantised then sliced, and
random weights drawn per shard all give the slice of the whole model's weights that the rank's layout names."""
import torch

from sluice.cli.model_store import default_gguf_path
from sluice.worker.loading.dummy_weights import dummy_checkpoint
from sluice.worker.loading.weights import load_checkpoint, to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.models.shard_layout import ShardLayout

RANK, WORLD_SIZE = 2, 3  # the last rank of SmolLM2's 3: the shortest vocabulary split would be padded


def _assert_same_state(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def _sharded(config: ModelConfig, whole_hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    layout = ShardLayout(config, RANK, WORLD_SIZE)
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
