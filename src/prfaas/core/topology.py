"""The two kinds of site and the two roles of a node, shared by every layer.

A *site* is a cluster in one datacenter; a *node* is one serving process (an instance of P GPUs in
production). What a deployment is made of (sites, nodes, links) is described once, by the
deployment file (``config.DeploymentConfig``); the simulator's and the planner's scenarios are
derived from it (``scenarios.py``). Pure data.
"""

from __future__ import annotations

import enum


class SiteKind(enum.Enum):
    PRFAAS = "prfaas"
    """A compute-dense, prefill-only cluster: a stateless KV producer."""
    PD = "pd"
    """A local prefill/decode cluster that can serve a request end to end."""


class NodeRole(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
