"""pool: the PrfaaS pool's front door, a service of its own shared by tenants (``docs/pool.md``).

``frontdoor.FrontDoor`` is its state and rules, sans I/O (epoch, receivers, leases, isolation,
outcomes) around ``policy.PoolAdmission``. The HTTP layer (API v1), ``prfaas up pool.yaml`` and the
placement driver are not written yet.
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
