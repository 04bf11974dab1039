"""The model folder's tokenizer files as one zip, for a gateway that tokenizes on its own (vLLM's GetTokenizer)."""
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from sluice.core.errors import NotFound

_WEIGHT_SUFFIXES = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".h5", ".msgpack"}


@dataclass(slots=True)
class TokenizerBundle:
    data: bytes
    sha256: str


def tokenizer_bundle(model_path: Path | None) -> TokenizerBundle:
    """Every top-level file of the folder but the weights: tokenizer, its config, the chat template and the model's
    config (what a tokenizer library reads)."""
    if model_path is None or not model_path.is_dir():
        raise NotFound("this deployment has no tokenizer folder to send")
    files = sorted(p for p in model_path.iterdir() if p.is_file() and p.suffix not in _WEIGHT_SUFFIXES)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            archive.write(path, path.name)
    data = buffer.getvalue()
    return TokenizerBundle(data, hashlib.sha256(data).hexdigest())
