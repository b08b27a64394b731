"""Rotating the deployment key without a restart: on SIGHUP a ``prfaas serve`` process re-reads its
``--config`` file and swaps its keyring (``serve.keyring.KeyringHolder``) for the file's ``psk``
(what it signs with) and ``accept_psks`` (what it also accepts).

A rotation across processes, each step one SIGHUP to every process once the file (on every host)
says so: (1) add the new key to ``accept_psks``: everyone accepts both; (2) make it the ``psk`` and
the old one an ``accept_psks`` entry: everyone signs with the new key, calls still in flight under
the old one verify; (3) drop the old key. A file that does not load is logged and changes nothing.
The KV handshake keeps the key the process started with (its links outlive a reload).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from prfaas.serve.keyring import Keyring, KeyringHolder, describe, ring_of_psks

log = logging.getLogger("prfaas.serve")


def ring_from_file(path: Path) -> Keyring:
    from prfaas.config import load_deployment

    d = load_deployment(path, require_psk=True)
    return ring_of_psks(d.psk, d.accept_psks)


def reload_keys(holder: KeyringHolder, load: Callable[[], Keyring]) -> bool:
    """Swap ``holder``'s ring for ``load()``'s; False (logged, nothing changed) when it fails."""
    try:
        ring = load()
    except Exception as exc:  # a bad edit must not take the process down
        log.error("keys not reloaded: %s", exc)
        return False
    holder.replace(ring)
    log.warning("keys reloaded: %s", describe(ring))
    return True


def install_sighup_reload(holder: KeyringHolder, config_path: Path | None) -> None:
    """From the running loop: SIGHUP reloads ``holder`` from ``config_path`` (no-op without one)."""
    if config_path is None:
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(
        signal.SIGHUP, lambda: reload_keys(holder, lambda: ring_from_file(config_path))
    )
