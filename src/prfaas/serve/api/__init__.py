"""serve.api: the gateway's OpenAI-compatible HTTP surface, built on a ``serve.backend.Backend``.

``create_gateway_app(backend, tokenizer, config)`` returns the FastAPI app:
``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE streaming or not),
``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize``, ``GET /health`` (liveness),
``GET /ready`` (readiness), ``GET /metrics``. It checks API keys when configured, validates
(vLLM's field rules: ``schemas``), tokenizes, admits (bounded; 429 when full), relays tokens with
a deadline, and records metrics. It knows nothing of routing, nodes or transfer (the backend).
"""

from prfaas.serve.api.app import create_gateway_app
from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.api.tokenizer import ByteTokenizer, Tokenizer

__all__ = [
    "ByteTokenizer",
    "GatewayHTTPConfig",
    "GatewayMetrics",
    "Tokenizer",
    "create_gateway_app",
]
