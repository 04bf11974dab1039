"""The floor plan holds: import-linter's contracts (pyproject.toml) pass on the tree and catch an arrow that points up,
and the scheduler service starts without torch."""
import shutil
import subprocess

from sluice.cli.python_command import python_command
from tests.scripts import ROOT, load_script

lint = load_script(ROOT / "scripts" / "lint_imports.py")


def test_the_import_contracts_hold():
    result = lint.lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_a_contract(tmp_path):
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(ROOT / name, tmp_path)
    for folder in ["sluice", *lint.subpackage_folders(ROOT).values()]:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "scheduler_svc" / "kv_cache" / "prefix_hash.py", "a") as module:
        module.write("from sluice.worker.runner.batch_state import BatchState\n")
    result = lint.lint_imports(tmp_path)
    assert result.returncode != 0
    assert "sluice.scheduler is not allowed to import sluice.worker" in result.stdout
    assert "sluice.scheduler.kv_cache.prefix_hash -> sluice.worker.runner.batch_state" in result.stdout


def test_the_scheduler_service_loads_no_torch():
    code = "import sys, sluice.scheduler.server; print(sorted({'torch', 'numpy', 'triton'} & set(sys.modules)))"
    result = subprocess.run(python_command("-c", code), cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
