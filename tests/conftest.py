import os
import sys
from pathlib import Path

import pytest
import torch

# Processes the tests spawn (torch.multiprocessing) import the tests package by name. The checkout goes after the
# installed packages, so its router/ and kernels/ folders shadow nothing (Hugging Face's `kernels` among them).
sys.path.append(str(Path(__file__).parents[1]))

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run in the interpreter on the CPU


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from sluice.cli.model_store import default_model

    return default_model()


@pytest.fixture(scope="session")
def hf_model(default_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="session")
def tiny_vl_dir(default_model_dir, tmp_path_factory) -> Path:
    """tests/router/tiny_vl_folder.py's tiny Qwen2.5-VL folder, with the serving tokenizer."""
    from tests.router.tiny_vl_folder import tiny_vl_folder

    return tiny_vl_folder(default_model_dir, tmp_path_factory.mktemp("tiny-qwen2_5_vl"))


@pytest.fixture(scope="session")
def hf_greedy_of(hf_model):
    """hf_greedy_of(prompt_ids, max_new_tokens): hf_model's greedy tokens, each prompt generated once a session
    (several modules check the same prompts)."""
    from tests.e2e.hf_reference import GreedyReferences

    return GreedyReferences(hf_model)
