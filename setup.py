"""Generates the gRPC code from protos/ into sluice/v1/ for every build, editable installs included, and
installs the service folders as subpackages of `sluice` (router/ as sluice.router, and so on)."""
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
PROTO_ROOT = ROOT / "protos"


def generate_protos() -> None:
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.glob("sluice/v1/*.proto"))
    well_known = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{well_known}", f"--python_out={ROOT}", f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}", *protos]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed")
    (ROOT / "sluice" / "v1" / "__init__.py").touch()


# Each service folder and the package it installs as; nothing installs a bare `router` or `kernels`.
SUBPACKAGE_FOLDERS = {"sluice.router": "router", "sluice.scheduler": "scheduler_svc", "sluice.worker": "worker_svc",
                      "sluice.kernels": "kernels"}


def packages() -> list[str]:
    generate_protos()  # sluice.v1 must exist when the packages are listed
    found = find_packages(include=["sluice", "sluice.*"])
    for package, folder in SUBPACKAGE_FOLDERS.items():
        found += [package, *(f"{package}.{sub}" for sub in find_packages(folder))]
    return found


setup(packages=packages(), package_dir=SUBPACKAGE_FOLDERS)
