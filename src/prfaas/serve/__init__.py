"""serve: the live processes (gateway, prefill and decode workers, control plane, launcher).

Thin asyncio drivers around ``policy/``, ``engine/`` and ``transfer/``. ``serve.backend`` is the
seam between the gateway's HTTP surface (``serve.api``) and whatever generates tokens behind it.
"""
