"""A pipeline stage's share of a model: the layer partition, the weights each stage reads from a checkpoint (its
layers', the embedding on the first stage, the final norm and the LM head on the last, a tied head read from the
embedding; a middle stage neither), the KV cache of its layers only, and what a stage refuses at start."""
import json

import pytest
import torch

from sluice.worker.config import WorkerConfig
from sluice.worker.engine import WorkerEngine
from sluice.worker.loading.dummy_weights import random_state_dict
from sluice.worker.loading.model_loader import ModelLoader
from sluice.worker.loading.weights import load_checkpoint
from sluice.worker.models.config import ModelConfig
from sluice.worker.parallel.group import ReplicaGroups
from sluice.worker.parallel.pipeline import PipelineStage, layer_partition
from tests.worker.test_gemma_families import gemma_config
from tests.worker.test_model_families import _TINY, FAMILIES

THREE_LAYERS = {**_TINY, **FAMILIES["llama"], "num_hidden_layers": 3}  # tied embeddings
UNUSED_ADDRESS = "127.0.0.1:1"  # the stages below load and set up their caches without meeting


def test_layers_split_as_evenly_as_they_divide_or_as_partitioned():
    assert layer_partition(30, 2) == [range(0, 15), range(15, 30)]
    assert layer_partition(30, 4) == [range(0, 8), range(8, 16), range(16, 23), range(23, 30)]
    assert layer_partition(30, 3, "8,11,11") == [range(0, 8), range(8, 19), range(19, 30)]
    with pytest.raises(ValueError, match="pp_layer_partition '8,11' must give each of the 3 stages at least one "
                                         "layer, 30 in all"):
        layer_partition(30, 3, "8,11")
    with pytest.raises(ValueError, match="pipeline_parallel_size 3 exceeds the model's 2 layers"):
        layer_partition(2, 3)


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("tiny-llama-3-layers")
    save_file(random_state_dict(THREE_LAYERS, torch.float32, torch.device("cpu"), seed=4), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(THREE_LAYERS))
    return folder


@pytest.mark.parametrize("index, weights", [
    (0, {"embed_tokens.weight", "layers.0."}),
    (1, {"layers.1."}),
    (2, {"layers.2.", "norm.weight", "lm_head.weight"}),
])
def test_each_stage_reads_its_weights_and_holds_the_kv_of_its_layers(three_layers, index, weights):
    config = WorkerConfig(model=str(three_layers), load_format="auto", pipeline_parallel_size=3, rank=index,
                          dist_init_address=UNUSED_ADDRESS)
    engine = WorkerEngine.load(config, ReplicaGroups(None, PipelineStage(index, 3, range(0), 0, 1)))
    held = set(engine.model.model.state_dict())
    assert {name if not name.startswith("layers.") else name[:len("layers.0.")] for name in held} == weights
    assert engine.init_cache(block_size=16, num_blocks=8) == 8
    assert len(engine.runner.kv_caches) == 1


def test_a_family_with_a_decoder_module_of_its_own_is_refused_naming_it():
    config = ModelConfig.from_hf(gemma_config("gemma2"))
    loader = ModelLoader(WorkerConfig(model="gemma", pipeline_parallel_size=2, dist_init_address=UNUSED_ADDRESS),
                         stage=PipelineStage(0, 2, range(0), 0, 1))
    with pytest.raises(ValueError, match="pipeline parallelism does not split Gemma2ForCausalLM yet"):
        loader.build(config, {})


def test_a_draft_model_is_refused_naming_speculative_decoding(three_layers):
    checkpoint = load_checkpoint(three_layers)
    loader = ModelLoader(WorkerConfig(model=str(three_layers), pipeline_parallel_size=2,
                                      dist_init_address=UNUSED_ADDRESS), stage=PipelineStage(0, 2, range(0), 0, 1))
    with pytest.raises(ValueError, match=r"a draft model \(speculative decoding\) needs an unsharded worker"):
        loader.build(*checkpoint, draft=load_checkpoint(three_layers))
