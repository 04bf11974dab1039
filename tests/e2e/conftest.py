import pytest
import torch

from tests.e2e.services import running_services


@pytest.fixture(scope="session")
def services(default_model_dir):
    with running_services(default_model_dir) as running:
        yield running


@pytest.fixture(scope="session")
def hf_model(default_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)
