"""The deployment file's ``gateway:`` section: the gateway's listeners (the OpenAI port and the
signed control port), its limits and timeouts, client keys, decision log, and the cores its
process is pinned to. Validation errors name the field (``gateway.control_port``, ...).

Pure pydantic: imports nothing of prfaas but the shared cores pattern.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from prfaas.deployment_sections import CPUS_PATTERN


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GatewayConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_inflight: int = Field(256, ge=1)
    max_queued: int = Field(512, ge=0)
    request_timeout_s: float = Field(600.0, gt=0)
    heartbeat_timeout_s: float = Field(3.0, gt=0, description="a silent node leaves rotation")
    path_wait_s: float = Field(
        30.0,
        ge=0,
        description="a request that finds no node in rotation (one restarting) waits this long "
        "for one to come back before its 503 (0: refuse at once)",
    )
    route_log_size: int = Field(
        10_000, ge=1, description="routes kept for /internal/routes (the newest; a ring)"
    )
    cpus: str | None = Field(
        None,
        pattern=CPUS_PATTERN,
        description="the cores the gateway process runs on (e.g. '1'). Within a site's "
        "engine.cpus, the simulator takes the gateway's CPU from that site's nodes; None: "
        "wherever the OS puts it (the simulator gives it a core of its own)",
    )
    control_port: int = Field(
        8001,
        ge=0,
        le=65535,
        description="the control listener (/internal/*, signed calls only; 0: pick a free one)",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="client keys for the OpenAI port (Authorization: Bearer KEY); $PRFAAS_API_KEY "
        "adds one; empty and unset: no key needed",
    )
    decision_log: str | None = Field(
        None,
        description="append each policy call's inputs and output (route, decode placement, control "
        "tick) to this JSON-lines file, for replay against the simulator's policies; off if unset",
    )

    @field_validator("api_keys")
    @classmethod
    def _usable_keys(cls, keys: list[str]) -> list[str]:
        for i, key in enumerate(keys):  # the message never repeats a key
            if len(key) < 8 or not all("!" <= c <= "~" for c in key):
                raise ValueError(
                    f"key {i} must be at least 8 printable ASCII characters without spaces"
                )
        return keys

    @model_validator(mode="after")
    def _two_listeners(self) -> GatewayConfig:
        if self.control_port != 0 and self.control_port == self.port:
            raise ValueError(
                f"gateway.control_port {self.control_port} is gateway.port too: the control "
                "listener needs its own port"
            )
        return self

    @property
    def url(self) -> str:
        """Base URL of the client-facing (OpenAI) listener."""
        return f"http://{self.host}:{self.port}"

    @property
    def control_url(self) -> str:
        """Base URL of the control listener nodes register and heartbeat to."""
        return f"http://{self.host}:{self.control_port}"
