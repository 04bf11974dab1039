import json

import pytest
import torch

from sluice.worker.loading.dummy_weights import random_state_dict
from tests.e2e.services import running_services
from tests.worker.test_model_families import _TINY, FAMILIES


@pytest.fixture(scope="session")
def services(default_model_dir):
    with running_services(default_model_dir) as running:
        yield running


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    """A Qwen3-shaped Hugging Face folder of random weights (no tokenizer: token ids in and out)."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    folder = tmp_path_factory.mktemp("tiny-qwen3")
    hf_config = {**_TINY, **FAMILIES["qwen3"], "intermediate_size": 96}
    state = random_state_dict(hf_config, torch.float32, torch.device("cpu"), seed=2)
    save_file({name: t if name.endswith("norm.weight") else t * 10 for name, t in state.items()},
              folder / "model.safetensors")
    AutoConfig.for_model(**hf_config).save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    return folder
