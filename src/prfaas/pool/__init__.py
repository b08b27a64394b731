"""pool: the PrfaaS pool's front door, a service of its own shared by tenants (``docs/pool.md``).

``frontdoor.FrontDoor`` is its state and rules, sans I/O (epoch, receivers, leases, isolation,
outcomes) around ``policy.PoolAdmission``; ``app.create_app`` its signed tenant API v1 (imported
from ``prfaas.pool.app``, not here: FastAPI stays out of ``import prfaas.pool``). ``prfaas up
pool.yaml`` and the placement driver that runs prefills on pool nodes are not written yet.
"""

from prfaas.pool.frontdoor import (
    API_VERSION,
    Abort,
    Answer,
    FrontDoor,
    Outcome,
    Placement,
    Receiver,
    Submit,
)

__all__ = [
    "API_VERSION",
    "Abort",
    "Answer",
    "FrontDoor",
    "Outcome",
    "Placement",
    "Receiver",
    "Submit",
]
