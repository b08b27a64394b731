"""``RenderOptions``: what ``prfaas k8s`` takes besides the deployment file (image, namespace,
the Kubernetes version targeted, where sites run, the weights volume, the metrics source).
Validated here so that a bad flag is one line naming it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prfaas.errors import UsageError

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

SUPPORTED_TARGETS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36", "1.37")
"""Kubernetes versions the manifests are written for: the pod-index label the StatefulSets'
pods read (``apps.kubernetes.io/pod-index``, beta in 1.28, on by default) and policy/v1 PDBs;
``kubernetes-validate`` 1.37 carries schemas for each."""

DEFAULT_TARGET = "1.37"


@dataclass(frozen=True, slots=True)
class SiteTopology:
    """Where a site's pods may run: a region and optionally a zone
    (``topology.kubernetes.io/region`` / ``zone``)."""

    region: str
    zone: str | None = None


@dataclass(frozen=True, slots=True)
class RenderOptions:
    name: str
    """Prefix of every object's name (DNS label): the file's stem by default."""
    image: str = "prfaas:0.1.0"
    """The container image every prfaas pod runs (built from the repository's Dockerfile)."""
    namespace: str = "prfaas"
    target: str = DEFAULT_TARGET
    """The Kubernetes version (major.minor) the manifests are for and are validated against."""
    topology: dict[str, SiteTopology] = field(default_factory=dict)
    """Per site: its region/zone. A site not named here is placed by the ``prfaas.io/site``
    node label alone."""
    weights_claim: str | None = None
    """PersistentVolumeClaim holding the model folder (torch, vLLM sites); default NAME-weights."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Where KEDA queries prfaas's metrics."""
    with_secrets: bool = False
    """Render Secret manifests holding the key (test clusters only; a separate 0600 file)."""

    def __post_init__(self) -> None:
        for flag, value in (("--name", self.name), ("--namespace", self.namespace)):
            if not DNS_LABEL.match(value) or len(value) > 40:
                raise UsageError(
                    f"{flag}: {value!r} is not a DNS label of at most 40 characters "
                    "(lowercase letters, digits, '-')"
                )
        if self.target not in SUPPORTED_TARGETS:
            raise UsageError(
                f"--target: unknown Kubernetes version {self.target!r} (one of "
                f"{', '.join(SUPPORTED_TARGETS)})"
            )
        if not self.image or any(c.isspace() for c in self.image):
            raise UsageError(f"--image: {self.image!r} is not an image reference")


def parse_topology(specs: list[str]) -> dict[str, SiteTopology]:
    """``SITE=REGION[/ZONE]`` flags into a mapping; a malformed one names itself."""
    out: dict[str, SiteTopology] = {}
    for spec in specs:
        site, sep, where = spec.partition("=")
        region, _, zone = where.partition("/")
        if not sep or not site or not region:
            raise UsageError(f"--site-topology: {spec!r} is not SITE=REGION[/ZONE]")
        out[site] = SiteTopology(region, zone or None)
    return out


def default_name(stem: str) -> str:
    """A DNS label from a file name (``two-site.yaml`` -> ``two-site``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return name or "prfaas"
