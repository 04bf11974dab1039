"""Checks import-linter's contracts (pyproject.toml) over a source tree laid out as it installs: grimp reads a
package's modules from its folder, so the service folders are staged inside sluice/ under their package names.

    .venv/bin/python scripts/lint_imports.py [SOURCE_ROOT]
"""
import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_SKIPPED = shutil.ignore_patterns("__pycache__")


def subpackage_folders(source: Path) -> dict[str, str]:
    """setup.py's SUBPACKAGE_FOLDERS: each subpackage of sluice that installs from a folder of its own."""
    for node in ast.parse((source / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SUBPACKAGE_FOLDERS":
            return ast.literal_eval(node.value)
    raise LookupError("setup.py assigns no SUBPACKAGE_FOLDERS")


def stage(source: Path, into: Path) -> None:
    shutil.copytree(source / "sluice", into / "sluice", ignore=_SKIPPED)
    for package, folder in subpackage_folders(source).items():
        shutil.copytree(source / folder, into.joinpath(*package.split(".")), ignore=_SKIPPED)


def lint_imports(source: Path) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as staged:
        stage(source, Path(staged))
        lint = Path(sys.executable).parent / "lint-imports"
        return subprocess.run([str(lint), "--no-cache", str(source / "pyproject.toml")], cwd=staged,
                              env={"PYTHONPATH": staged}, capture_output=True, text=True)


if __name__ == "__main__":
    result = lint_imports(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1]).resolve())
    print(result.stdout + result.stderr, end="")
    sys.exit(result.returncode)
