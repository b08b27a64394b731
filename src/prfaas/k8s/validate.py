"""Offline validation of rendered manifests: built-in kinds against the Kubernetes OpenAPI
schemas of a pinned version (``kubernetes-validate``'s strict schemas, shipped in its wheel: no
network), custom resources against upstream CRDs (``spec.versions[].schema.openAPIV3Schema``)
with ``jsonschema``. Each problem is one line naming the object and the field."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prfaas.config import load_yaml_mapping

Manifest = dict[str, Any]

NOT_VALIDATED = frozenset({"HTTPRoute"})
"""Kinds whose CRDs are not among the pinned ones (Gateway API's): rendered, not validated."""


@dataclass(frozen=True, slots=True, eq=False)
class CrdSchema:
    group: str
    kind: str
    version: str
    schema: dict[str, Any]


@functools.cache
def load_crds(crd_dir: Path) -> dict[tuple[str, str], CrdSchema]:
    """(apiVersion, kind) -> its schema, for every CRD file in ``crd_dir``."""
    out: dict[tuple[str, str], CrdSchema] = {}
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = load_yaml_mapping(path, what="CRD file")
        spec = crd.get("spec", {})
        group, kind = spec.get("group"), spec.get("names", {}).get("kind")
        for v in spec.get("versions", []):
            schema = v.get("schema", {}).get("openAPIV3Schema")
            if group and kind and schema:
                out[(f"{group}/{v['name']}", kind)] = CrdSchema(group, kind, v["name"], schema)
    return out


def _problems(m: Manifest, validator: Any) -> list[str]:
    """Every error, one line each, in field order."""
    errors = sorted(validator.iter_errors(m), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{_where(m)}: {_field(e.absolute_path)}: {e.message}" for e in errors]


def _where(m: Manifest) -> str:
    return f"{m.get('kind', '?')}/{m.get('metadata', {}).get('name', '?')}"


def _field(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


@functools.cache
def _builtin_validator(target: str, api_version: str, kind: str) -> Any:
    """A validator over ``kubernetes-validate``'s strict schema for (kind, apiVersion) at
    ``target`` (its files, read once: the package's own ``validate`` re-reads the 5 MB
    definitions on every call). None when it has no schema for the kind."""
    import json

    import importlib_resources
    import jsonschema
    from referencing import Registry, Resource

    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    root = importlib_resources.files("kubernetes_validate").joinpath(
        f"kubernetes-json-schema/v{target}.0-local-strict"
    )
    schema_file = root.joinpath(f"{kind.lower()}-{group_version}.json")
    if not schema_file.is_file():
        return None
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    definitions = json.loads(root.joinpath("_definitions.json").read_text(encoding="utf-8"))
    registry: Registry[Any] = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_builtin(m: Manifest, target: str) -> list[str]:
    validator = _builtin_validator(target, str(m.get("apiVersion")), str(m.get("kind")))
    if validator is None:
        return [
            f"{_where(m)}: no Kubernetes {target} schema for {m.get('apiVersion')} {m.get('kind')}"
        ]
    return _problems(m, validator)


def validate_custom(m: Manifest, crds: dict[tuple[str, str], CrdSchema]) -> list[str]:
    crd = crds.get((m.get("apiVersion", ""), m.get("kind", "")))
    if crd is None:
        return [f"{_where(m)}: no CRD for {m.get('apiVersion')} {m.get('kind')}"]
    return _problems(m, _crd_validator(crd))


@functools.cache
def _crd_validator(crd: CrdSchema) -> Any:
    import jsonschema

    return jsonschema.Draft7Validator(crd.schema)


BUILTIN_GROUPS = frozenset(
    {
        "",
        "apps",
        "batch",
        "policy",
        "autoscaling",
        "networking.k8s.io",
        "rbac.authorization.k8s.io",
        "storage.k8s.io",
    }
)
"""API groups of the kinds ``kubernetes-validate`` knows (``inference.networking.k8s.io`` is a
CRD's, not ``networking.k8s.io``'s)."""


def is_builtin(m: Manifest) -> bool:
    api = str(m.get("apiVersion", ""))
    return (api.rpartition("/")[0] if "/" in api else "") in BUILTIN_GROUPS


def validate_all(
    manifests: Sequence[Manifest], target: str, crd_dir: Path | None = None
) -> list[str]:
    """Every problem found; custom resources are checked only when ``crd_dir`` is given."""
    crds = load_crds(crd_dir) if crd_dir is not None else None
    problems: list[str] = []
    for m in manifests:
        if m.get("kind") in NOT_VALIDATED:
            continue
        if is_builtin(m):
            problems.extend(validate_builtin(m, target))
        elif crds is not None:
            problems.extend(validate_custom(m, crds))
    return problems
