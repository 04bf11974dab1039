"""A draft model beside the target in the worker: one of another vocabulary is refused at start; the worker takes
requests as long as the shorter of the two models does; each block of the KV pool holds both models' KV."""
import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.shapes import shape_config
from sluice.worker.loading.weights import to_worker_layout
from sluice.worker.models.config import ModelConfig
from sluice.worker.runner.kv_cache import bytes_per_block

CONFIG = WorkerConfig(model="SmolLM2-tiny", load_format="dummy", kv_cache_gib=1 / 1024)


def _checkpoint(**overrides) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    hf_config = shape_config("SmolLM2-tiny") | overrides
    model_config = ModelConfig.from_hf(hf_config)
    return model_config, to_worker_layout(random_state_dict(hf_config, torch.float32, torch.device("cpu"), 0),
                                          model_config)


def test_a_draft_of_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match=r"vocabulary \(1000 tokens\) is not the target's \(49152\)"):
        ModelLoader(CONFIG).build(*_checkpoint(), draft=_checkpoint(vocab_size=1000))


def test_the_pool_holds_both_models_kv_and_the_shorter_model_length_applies():
    target, draft = _checkpoint(), _checkpoint(max_position_embeddings=512, num_hidden_layers=1)
    engine = WorkerEngine(CONFIG, ModelLoader(CONFIG).build(*target, draft=draft))
    assert engine.max_model_len == 512
    num_blocks = engine.init_cache(block_size=16, max_model_len=8192)
    both = bytes_per_block(target[0], 16, torch.float32) + bytes_per_block(draft[0], 16, torch.float32)
    assert num_blocks == CONFIG.kv_cache_bytes // both
    draft_caches, target_caches = engine.runner.drafter.kv_caches, engine.runner.kv_caches
    assert len(draft_caches) == 1 and draft_caches[0][0].shape[0] == num_blocks == target_caches[0][0].shape[0]
