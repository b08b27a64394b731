"""Client API keys on the OpenAI port (like vLLM's ``--api-key``): ``ApiKeyMiddleware`` answers
401 to a guarded route without ``Authorization: Bearer <key>``, before the body is read.

Guarded: ``/v1/*``, ``/tokenize``, ``/detokenize``. Open: everything else (``/health``, ``/ready``,
``/metrics``; operators and load balancers probe them without a key). The key is compared as a
SHA-256 digest with ``hmac.compare_digest`` against every configured key, so the time taken says
neither how long a key is nor which one matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from prfaas.serve.api.errors import error_response, unauthorized

API_KEY_ENV = "PRFAAS_API_KEY"
"""One more accepted key, from the environment (as vLLM's ``VLLM_API_KEY``)."""
_GUARDED_PATHS = ("/tokenize", "/detokenize")


def resolve_api_keys(configured: Iterable[str], environ: Mapping[str, str]) -> tuple[str, ...]:
    """The deployment file's ``gateway.api_keys`` plus ``$PRFAAS_API_KEY`` when set and not
    empty (``GatewayHTTPConfig`` checks each)."""
    keys = list(configured)
    env_key = environ.get(API_KEY_ENV, "")
    if env_key and env_key not in keys:
        keys.append(env_key)
    return tuple(keys)


def guarded(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/") or path in _GUARDED_PATHS


class ApiKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: Iterable[str]) -> None:
        self._app = app
        self._digests = tuple(_digest(k.encode()) for k in keys)
        if not self._digests:
            raise ValueError("ApiKeyMiddleware needs at least one key")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and guarded(scope["path"]) and not self._authorized(scope):
            await error_response(unauthorized())(scope, receive, send)
            return
        await self._app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None:
            return False
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        presented = _digest(token.strip())
        ok = False
        for digest in self._digests:  # no early exit: every key is compared
            ok |= hmac.compare_digest(presented, digest)
        return ok


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()
