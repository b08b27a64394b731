"""``ControlClient``: signed calls to a gateway's control listener, and its ``/ready``.

The one client of the gateway's ``/internal/*`` routes outside the gateway's own processes: the
launcher (waiting for nodes, ``prfaas up``), ``prfaas status`` and ``prfaas drain``. Every call is
signed with the deployment's key (``serve.auth.SignedAuth``). Failures are typed so the commands can
tell a user's mistake (a refused key, an unknown node: exit 2) from a gateway that does not answer
(exit 1, naming the URL).
"""

from __future__ import annotations

from typing import Any

import httpx

from prfaas.config import DeploymentConfig
from prfaas.serve.answer_auth import AnswerNotAuthentic


class GatewayUnreachable(RuntimeError):
    """Nothing answered at ``url`` (refused, timed out, reset)."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"gateway not reachable at {url}: {why}")
        self.url = url


class ControlRefused(RuntimeError):
    """The gateway answered with an error status; ``message`` is its error text."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url}: {status}: {message}")
        self.url = url
        self.status = status
        self.message = message


def _error_message(r: httpx.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return r.text[:200] or r.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:200]


class ControlClient:
    """Synchronous (the launcher and the commands are threads and plain loops, not asyncio)."""

    def __init__(self, deployment: DeploymentConfig, timeout_s: float = 2.0) -> None:
        from prfaas.serve.auth import SignedAuth
        from prfaas.serve.control_tls import control_tls, sync_client_options
        from prfaas.serve.keyring import ring_of_psks

        self.url = deployment.control_url  # https with tls.control_plane
        self.client_url = deployment.gateway.url
        self._http = httpx.Client(
            auth=SignedAuth(ring_of_psks(deployment.psk, deployment.accept_psks)),
            timeout=timeout_s,
            trust_env=False,
            **sync_client_options(control_tls(deployment)),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.url}{path}"
        try:
            try:
                r = self._http.request(method, url, json=body)
            except httpx.RemoteProtocolError:
                # A kept-alive connection the gateway closed (its idle timeout, 5 s) just as we
                # reused it: a read goes again on a fresh one (seen: `prfaas profile` reading
                # /internal/nodes after a class of requests, fresh-clone CI 2026-12-07).
                if method != "GET":
                    raise
                r = self._http.request(method, url, json=body)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(self.url, str(exc) or type(exc).__name__) from None
        except AnswerNotAuthentic as exc:  # not the gateway we know, or someone in between
            raise GatewayUnreachable(self.url, f"answer not authentic: {exc}") from None
        if r.status_code >= 400:
            raise ControlRefused(url, r.status_code, _error_message(r))
        return r.json()

    def nodes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/internal/nodes")
        return result

    def endpoints(self) -> list[dict[str, Any]]:
        """Where each registered node listens (its process's latest registration)."""
        result: list[dict[str, Any]] = self._call("GET", "/internal/endpoints")
        return result

    def routes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/internal/routes")
        return result

    def control(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/internal/control")
        return result

    def drain(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/internal/nodes/{node}/drain")
        return result

    def resume(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/internal/nodes/{node}/resume")
        return result

    def autoscale(self) -> list[dict[str, Any]]:
        """The elastic pool's last decision per group (empty without ``autoscale:``)."""
        result: list[dict[str, Any]] = self._call("GET", "/internal/autoscale")
        return result

    def report_autoscale(self, report: dict[str, Any]) -> None:
        """Post one autoscaler decision (``gateway.autoscale_board.AutoscaleReport``'s fields)."""
        self._call("POST", "/internal/autoscale", report)

    def ready(self) -> str | None:
        """None when the gateway's client port says ``/ready``; else the reason it gave."""
        url = f"{self.client_url}/ready"
        try:
            r = self._http.get(url, auth=None)
        except httpx.TransportError as exc:
            raise GatewayUnreachable(self.client_url, str(exc) or type(exc).__name__) from None
        if r.status_code == 200:
            return None
        return _error_message(r)
