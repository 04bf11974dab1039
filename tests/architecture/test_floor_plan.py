"""The floor plan holds: import-linter's contracts (pyproject.toml) pass on the tree and catch an arrow that points up,
and the scheduler service starts without torch."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
PACKAGES = ["sluice", "router", "scheduler_svc", "worker_svc", "kernels"]
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def _lint_imports(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tree, env={"PYTHONPATH": str(tree)},
                          capture_output=True, text=True)


def test_the_import_contracts_hold():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_a_contract(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "scheduler_svc" / "prefix_hash.py", "a") as module:
        module.write("from worker_svc.runner.batch_state import BatchState\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "scheduler_svc is not allowed to import worker_svc" in result.stdout
    assert "scheduler_svc.prefix_hash -> worker_svc.runner.batch_state" in result.stdout


def test_the_scheduler_service_loads_no_torch():
    code = "import sys, scheduler_svc.server; print(sorted({'torch', 'numpy', 'triton'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
