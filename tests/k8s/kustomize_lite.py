"""Renders a kustomization the way kustomize does for the features Sluice's overlays use (resources, strategic-merge
patches, image tags), for machines without kustomize or kubectl."""
import copy
from pathlib import Path

import yaml


def render(directory: Path) -> list[dict]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    documents: list[dict] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        documents += render(path) if path.is_dir() else _load(path)
    for patch in kustomization.get("patches", []):
        for patch_document in _load(directory / patch["path"]):
            target = _find(documents, patch_document)
            target.update(_merge(target, patch_document))
    for image in kustomization.get("images", []):
        _retag(documents, image)
    return documents


def _load(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _find(documents: list[dict], patch: dict) -> dict:
    key = (patch["kind"], patch["metadata"]["name"])
    return next(d for d in documents if (d["kind"], d["metadata"]["name"]) == key)


def _merge(base, patch):
    """Strategic merge: maps merge key by key, lists of named maps merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all(isinstance(i, dict) and "name" in i
                                                                    for i in base + patch):
        merged = {item["name"]: copy.deepcopy(item) for item in base}
        for item in patch:
            merged[item["name"]] = _merge(merged[item["name"]], item) if item["name"] in merged else item
        return list(merged.values())
    return copy.deepcopy(patch)


def _retag(node, image: dict) -> None:
    if isinstance(node, dict):
        name = node.get("image")
        if isinstance(name, str) and name.split(":")[0] == image["name"]:
            node["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
        for value in node.values():
            _retag(value, image)
    elif isinstance(node, list):
        for value in node:
            _retag(value, image)
