"""The read-only routes: ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health`` (liveness:
the process answers; with in-flight and queued counts and the backend's own report), ``GET /ready``
(readiness: the backend could serve a request now) and ``GET /metrics``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from prfaas.serve.api.errors import ApiError, error_response, not_ready
from prfaas.serve.api.metrics import CONTENT_TYPE
from prfaas.serve.api.state import GatewayState

HEALTH_TIMEOUT_S = 5.0
_CREATED = int(time.time())


def add_info_routes(app: FastAPI, gateway: GatewayState) -> None:
    def model_card() -> dict[str, Any]:
        info = gateway.backend.model_info()
        return {
            "id": info.name,
            "object": "model",
            "created": _CREATED,
            "owned_by": "prfaas",
            "max_model_len": info.max_context_tokens,
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> Response:
        card = model_card()
        if model_id != card["id"]:
            return error_response(
                ApiError(
                    404, f"model {model_id!r} does not exist", param="model", code="model_not_found"
                )
            )
        return JSONResponse(card)

    @app.get("/health")
    async def health() -> Response:
        admission = gateway.admission
        body: dict[str, Any] = {
            "status": "ok",
            "in_flight": admission.num_in_flight,
            "queued": admission.num_queued,
        }
        try:
            backend = await asyncio.wait_for(gateway.backend.health(), HEALTH_TIMEOUT_S)
        except Exception as exc:  # the point of /health is to report this, not to raise
            backend = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        body["backend"] = backend
        if not isinstance(backend, dict) or backend.get("status", "ok") != "ok":
            body["status"] = "unavailable"
            return JSONResponse(body, status_code=503)
        return JSONResponse(body)

    @app.get("/ready")
    async def ready() -> Response:
        try:
            reason = await asyncio.wait_for(gateway.backend.ready(), HEALTH_TIMEOUT_S)
        except TimeoutError:
            reason = f"the backend's readiness check took over {HEALTH_TIMEOUT_S:g} s"
        except Exception as exc:  # reported, not raised: a probe must get an answer
            reason = f"the backend's readiness check failed: {type(exc).__name__}: {exc}"
        if reason is None:
            return JSONResponse({"status": "ready"})
        return error_response(not_ready(reason))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gateway.metrics.render(), media_type=CONTENT_TYPE)
