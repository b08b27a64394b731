"""The connector's settings (``kv_connector_extra_config``) and per-request ``kv_transfer_params``.

``ConnectorSettings`` is the one description of the settings: the sidecar
(``serve.vllm.server``) builds one and writes it with ``to_extra_config``, the connector reads it
back with ``from_extra_config``. Both come from outside (a client could send its own params, a
user their own extra config), so each is checked here and a bad value is named in the error.
Pure: no torch, no vllm, no I/O (the PSK is read from the environment variable the settings
name, by ``psk_from_env``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_LOAD_TIMEOUT_S = 30.0
DEFAULT_PSK_ENV = "PRFAAS_KV_PSK"
"""The environment variable that carries the deployment's key to the connector."""
DEFAULT_LINK = "cross-site"
"""The destination link's name when the settings give none."""
UNCLAIMED_STAGED_TTL_S = 60.0
"""A received session nobody claims within this time is freed (contract)."""


class SettingsError(ValueError):
    """A bad connector setting or kv_transfer_params field (the message names it)."""


def _int(cfg: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise SettingsError(f"{key} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _str(cfg: Mapping[str, Any], key: str, default: str | None = None) -> str:
    value = cfg.get(key, default)
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{key} must be a non-empty string, got {value!r}")
    return value


def _float_or_none(cfg: Mapping[str, Any], key: str) -> float | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise SettingsError(f"{key} must be a number > 0 or null, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorSettings:
    """``kv_connector_extra_config`` of the contract."""

    listen_host: str | None = None
    """Where the receiver binds (None with listen_port: this server never decodes remotely)."""
    listen_port: int | None = None
    """The receiver's port (the node's registered transfer port); None: no receiver."""
    psk_env: str = DEFAULT_PSK_ENV
    num_connections: int = 4
    kv_budget_mib: int = 1024
    """Bytes of received sessions staged at once (verified or arriving, not yet installed)."""
    pace_gbps: float | None = None
    """Pacing of cross-site sends (an emulated inter-site link); None: unpaced. The agent's
    ``set_pace`` changes it while the server runs."""
    agent_socket: str | None = None
    """Unix socket the connector's worker side serves for its sidecar; None: none."""
    link_gbps: float | None = None
    """The inter-site link's rate the deployment file names: where the connector's capacity
    estimate starts ("configured") until its cross-site sends measure the link; None: the
    pace's (no pace either: not estimated)."""
    link: str = DEFAULT_LINK
    """The destination link cross-site sends cross (its ``LinkId``, e.g. "pf->pd"): the name of
    its reading in the agent's ``stats``."""

    @classmethod
    def from_extra_config(cls, cfg: Mapping[str, Any]) -> ConnectorSettings:
        port = cfg.get("listen_port")
        return cls(
            listen_host=_str(cfg, "listen_host", "127.0.0.1") if port is not None else None,
            listen_port=_int(cfg, "listen_port", None, 0, 65535) if port is not None else None,
            psk_env=_str(cfg, "psk_env", DEFAULT_PSK_ENV),
            num_connections=_int(cfg, "num_connections", 4, 1, 64),
            kv_budget_mib=_int(cfg, "kv_budget_mib", 1024, 1, 1 << 30),
            pace_gbps=_float_or_none(cfg, "pace_gbps"),
            agent_socket=_str(cfg, "agent_socket") if cfg.get("agent_socket") else None,
            link_gbps=_float_or_none(cfg, "link_gbps"),
            link=_str(cfg, "link", DEFAULT_LINK),
        )

    def to_extra_config(self) -> dict[str, Any]:
        """The ``kv_connector_extra_config`` that ``from_extra_config`` reads back as these."""
        return {
            "listen_host": self.listen_host,
            "listen_port": self.listen_port,
            "psk_env": self.psk_env,
            "num_connections": self.num_connections,
            "kv_budget_mib": self.kv_budget_mib,
            "pace_gbps": self.pace_gbps,
            "agent_socket": self.agent_socket,
            "link_gbps": self.link_gbps,
            "link": self.link,
        }

    @property
    def kv_budget_bytes(self) -> int:
        return self.kv_budget_mib << 20

    @property
    def pace_bytes_per_s(self) -> float | None:
        return None if self.pace_gbps is None else self.pace_gbps * 1e9 / 8

    @property
    def link_bytes_per_s(self) -> float | None:
        """The link's configured rate (``link_gbps``, else the pace), bytes/s; None: unknown."""
        gbps = self.link_gbps if self.link_gbps is not None else self.pace_gbps
        return None if gbps is None else gbps * 1e9 / 8

    def psk(self) -> bytes:
        """The deployment's PSK from the environment (never the command line)."""
        return psk_from_env(self.psk_env)


def psk_from_env(name: str) -> bytes:
    value = os.environ.get(name, "")
    if len(value.encode()) < 16:
        raise SettingsError(
            f"environment variable {name} must hold the KV PSK (at least 16 bytes); "
            f"it holds {len(value.encode())}"
        )
    return value.encode()


def _prfaas_entry(params: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not params:
        return None
    entry = params.get("prfaas")
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise SettingsError(f"kv_transfer_params.prfaas must be an object, got {entry!r}")
    if params.get("do_remote_decode") and params.get("do_remote_prefill"):
        # One request is either the prefill or the decode half of a transfer: taken as both, the
        # decode half would be parked for KV that its own prefill half was meant to send.
        raise SettingsError(
            "kv_transfer_params: do_remote_decode and do_remote_prefill are exclusive"
        )
    return entry


def _transfer_id(entry: Mapping[str, Any]) -> str:
    tid = entry.get("transfer_id")
    if not isinstance(tid, str) or not 0 < len(tid.encode()) <= 128:
        raise SettingsError(f"kv_transfer_params.prfaas.transfer_id must be 1..128 bytes: {tid!r}")
    return tid


@dataclass(frozen=True, slots=True)
class SendParams:
    """Prefill side: where this request's KV goes, and what the receiver already holds."""

    transfer_id: str
    host: str
    port: int
    cross_site: bool
    skip_tokens: int


@dataclass(frozen=True, slots=True)
class LoadParams:
    """Decode side: which received session holds this request's KV, and how long to wait."""

    transfer_id: str
    timeout_s: float


def send_params(params: Mapping[str, Any] | None) -> SendParams | None:
    """The prefill side's params (``do_remote_decode`` with a ``prfaas`` entry), else None."""
    entry = _prfaas_entry(params)
    if entry is None or not (params or {}).get("do_remote_decode"):
        return None
    cross = entry.get("cross_site", False)
    if not isinstance(cross, bool):
        raise SettingsError(f"kv_transfer_params.prfaas.cross_site must be a bool, got {cross!r}")
    return SendParams(
        transfer_id=_transfer_id(entry),
        host=_str(entry, "host"),
        port=_int(entry, "port", None, 1, 65535),
        cross_site=cross,
        skip_tokens=_int(entry, "skip_tokens", 0, 0, 1 << 40),
    )


def load_params(params: Mapping[str, Any] | None) -> LoadParams | None:
    """The decode side's params (``do_remote_prefill`` with a ``prfaas`` entry), else None."""
    entry = _prfaas_entry(params)
    if entry is None or not (params or {}).get("do_remote_prefill"):
        return None
    timeout = entry.get("timeout_s", DEFAULT_LOAD_TIMEOUT_S)
    bad = isinstance(timeout, bool) or not isinstance(timeout, int | float)
    if bad or not 0 < timeout < math.inf:  # JSON's Infinity would wait forever
        raise SettingsError(
            f"kv_transfer_params.prfaas.timeout_s must be finite and > 0, got {timeout!r}"
        )
    return LoadParams(_transfer_id(entry), float(timeout))
