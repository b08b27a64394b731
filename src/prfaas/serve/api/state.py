"""``GatewayState``: what the gateway's routes share (backend, tokenizer, settings, metrics,
admission, the unknown-field log). Its own module so that the route modules (``health``,
``tokenization``) and ``app`` all import it, and none of them imports ``app``."""

from __future__ import annotations

import logging

from prfaas.serve.api.admission import Admission
from prfaas.serve.api.config import GatewayHTTPConfig
from prfaas.serve.api.metrics import GatewayMetrics
from prfaas.serve.api.tokenizer import Tokenizer
from prfaas.serve.backend import Backend

log = logging.getLogger("prfaas.serve.api")


class UnknownFields:
    """Logs the unknown fields of a request (they are dropped, as vLLM does), once per distinct
    set: a client sending the same extra at 1,000 requests/s gives one line, not 1,000 a second.
    Remembers at most ``MAX_SETS`` sets, then stops logging; names are shortened in the log."""

    MAX_SETS = 1024
    MAX_NAMES_LOGGED = 16

    def __init__(self) -> None:
        self._seen: set[tuple[str, tuple[str, ...]]] = set()

    def note(self, endpoint: str, names: tuple[str, ...]) -> None:
        key = (endpoint, tuple(sorted(names)))
        if not names or key in self._seen or len(self._seen) >= self.MAX_SETS:
            return
        self._seen.add(key)
        shown = ", ".join(repr(n[:64]) for n in key[1][: self.MAX_NAMES_LOGGED])
        more = len(names) - self.MAX_NAMES_LOGGED
        log.warning(
            "%s: ignoring unknown field(s) %s%s (logged once per set)",
            endpoint,
            shown,
            f" and {more} more" if more > 0 else "",
        )
        if len(self._seen) == self.MAX_SETS:
            log.warning("%d sets of unknown fields seen; no more are logged", self.MAX_SETS)


class GatewayState:
    """The gateway's shared parts; ``app.Gateway`` adds the generation endpoints' handling."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        config: GatewayHTTPConfig,
        metrics: GatewayMetrics,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = metrics
        self.admission = Admission(config.max_in_flight, config.max_queued)
        self.unknown_fields = UnknownFields()
        metrics.in_flight.set_function(lambda: self.admission.num_in_flight)
        metrics.queued.set_function(lambda: self.admission.num_queued)
