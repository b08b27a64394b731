"""Kubernetes manifests from a deployment file (``prfaas k8s``), one concept per module.

``render.render_deployment`` turns a validated ``DeploymentConfig`` into a ``Rendering``: plain
manifest mappings (what ``kubectl apply`` reads), the Secret manifests kept apart, and the warnings
for keys Kubernetes cannot honour. ``emit`` writes them deterministically; ``validate`` checks them
offline against pinned Kubernetes schemas and the upstream CRDs. ``entry`` is what a pod runs at
start (composes its deployment file from the ConfigMap and the Secret, then execs ``prfaas
serve``). Nothing here talks to a cluster. Must not import ``serve`` (the pods import it, not us).
"""

from prfaas.k8s.options import RenderOptions
from prfaas.k8s.render import Rendering, render_deployment

__all__ = ["RenderOptions", "Rendering", "render_deployment"]
