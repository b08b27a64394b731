"""Writing a rendering: ``DIR/<name>.yaml`` (every manifest, one YAML document each, sorted
keys: byte-identical for the same inputs), ``DIR/<name>.secrets.yaml`` (mode 0600, only with
``--with-secrets``) and ``DIR/<name>.warnings.txt`` when Kubernetes cannot honour some key."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prfaas.k8s.render import Rendering
from prfaas.k8s.yaml_text import dump_yaml


def to_yaml(manifests: Iterable[dict[str, Any]], head: str) -> str:
    docs = [dump_yaml(m) for m in manifests]
    return head + "---\n" + "---\n".join(docs)


def write_rendering(r: Rendering, out_dir: Path, name: str, source: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    head = f"# Rendered by `prfaas k8s` from {source}. Holds no key material.\n"
    main = out_dir / f"{name}.yaml"
    main.write_text(to_yaml(r.manifests, head), encoding="utf-8")
    written = [main]
    notes = out_dir / f"{name}.warnings.txt"
    if r.warnings:
        notes.write_text("".join(f"warning: {w}\n" for w in r.warnings), encoding="utf-8")
        written.append(notes)
    elif notes.exists():
        notes.unlink()
    if r.secrets:
        path = out_dir / f"{name}.secrets.yaml"
        text = to_yaml(r.secrets, f"# Secrets for {source}: key material, test clusters only.\n")
        # created 0600 before a byte is written: never readable by others, even for an instant
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o600)
        written.append(path)
    return written
