"""Sluice installs and imports as one package: the service folders are subpackages of sluice, and no module of the
repository imports a bare `router`, `kernels`, `scheduler_svc` or `worker_svc` (the first two are other projects'
names on PyPI; Hugging Face's `kernels` is a dependency of transformers)."""
import ast
import importlib.util
import subprocess
from pathlib import Path

import pytest

from sluice.cli.python_command import python_command
from tests.architecture.test_floor_plan import ROOT, lint

BARE_NAMES = {"router", "kernels", "scheduler_svc", "worker_svc"}


def _repository_modules() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).exists()]


def _bare_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                  if name.split(".")[0] in BARE_NAMES]
    return found


def test_no_module_imports_a_bare_service_name():
    modules = _repository_modules()
    assert len(modules) > 200
    assert [found for path in modules for found in _bare_imports(path)] == []


def test_the_check_sees_a_bare_import():
    module = ROOT / "sluice" / "_bare_import_probe.py"
    module.write_text("import kernels.rms_norm\nfrom router import server\nfrom sluice.kernels import rms_norm\n")
    try:
        assert _bare_imports(module) == ["sluice/_bare_import_probe.py:1 imports kernels.rms_norm",
                                         "sluice/_bare_import_probe.py:2 imports router"]
    finally:
        module.unlink()


@pytest.mark.parametrize("package, folder", sorted(lint.subpackage_folders(ROOT).items()))
def test_each_service_folder_imports_as_a_subpackage_of_sluice(package, folder):
    spec = importlib.util.find_spec(package)
    assert Path(spec.origin) == ROOT / folder / "__init__.py"


def test_a_child_process_started_in_the_checkout_does_not_see_the_kernels_folder_as_kernels():
    code = "import importlib.util; spec = importlib.util.find_spec('kernels'); print(spec and spec.origin)"
    origin = subprocess.run(python_command("-c", code), cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert origin.strip() != str(ROOT / "kernels" / "__init__.py")
