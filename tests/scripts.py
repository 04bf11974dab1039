"""The repository's scripts (scripts/, benchmarks/), which are not packages, loaded as modules for their tests."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
