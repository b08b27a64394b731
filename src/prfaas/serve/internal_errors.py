"""OpenAI-style error bodies for the internal (signed) HTTP APIs: the gateway's control listener and
the worker API. ``install(app)`` turns FastAPI's ``HTTPException`` (``{"detail": ...}``) and its
422 validation answer into ``{"error": {"message", "type", "param", "code"}}``, a validation error
as a 400 naming the bad field, so every refusal a caller sees has the same shape as the client
API's and ``serve.auth``'s 401."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> JSONResponse:
    error_type = "invalid_request_error" if status < 500 else "server_error"
    if status == 404:
        error_type = "not_found_error"
    body: dict[str, Any] = {
        "error": {"message": message, "type": error_type, "param": param, "code": code}
    }
    return JSONResponse(body, status_code=status)


def install(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        field = ".".join(loc) or None
        message = f"{field}: {first.get('msg', 'invalid')}" if field else "invalid body"
        return error_response(400, message, param=field, code="invalid_field")
