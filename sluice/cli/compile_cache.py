"""--compile-cache: the folder where Triton and torch inductor keep the kernels they compile, set in the environment
before either reads it (both read it when they first compile)."""
import os
from pathlib import Path

CACHES = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}  # variable -> its subfolder


def use_compile_cache(folder: str) -> None:
    """Points both caches into folder (empty: leaves them where they are)."""
    if folder:
        for variable, subfolder in CACHES.items():
            os.environ[variable] = str(Path(folder) / subfolder)
