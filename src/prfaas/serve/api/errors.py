"""OpenAI-style error answers: ``{"error": {"message", "type", "param", "code"}}`` with a status.

``ApiError`` is raised anywhere in ``serve.api``; ``error_response`` turns it into a JSON answer
(once a stream has started, the app sends it as a final SSE error event instead). No FastAPI
import here.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from prfaas.serve.backend import GenerationError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def from_generation_error(exc: GenerationError) -> ApiError:
    return ApiError(exc.status, exc.message, error_type=exc.error_type, code=exc.code)


def internal_error(exc: BaseException) -> ApiError:
    # A backend bug: say what broke (type and message) without a traceback.
    return ApiError(
        500,
        f"backend failed: {type(exc).__name__}: {exc}",
        error_type="server_error",
        code="internal_error",
    )


def timeout_error(timeout_s: float) -> ApiError:
    return ApiError(
        504,
        f"request did not finish within its deadline of {timeout_s:g} s",
        error_type="timeout",
        code="timeout",
    )


def overloaded(reason: str, retry_after_s: int) -> ApiError:
    return ApiError(
        429,
        f"gateway overloaded ({reason}); retry after {retry_after_s} s",
        error_type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def unauthorized() -> ApiError:
    # OpenAI's answer to a bad key; never says which keys exist or how close the guess was.
    return ApiError(
        401,
        "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def not_ready(reason: str) -> ApiError:
    return ApiError(503, f"not ready: {reason}", error_type="service_unavailable", code="not_ready")
