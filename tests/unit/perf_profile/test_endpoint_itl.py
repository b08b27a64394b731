"""How `prfaas profile --endpoint` reads a decode step from concurrent streams
(`commands.profile_endpoint._itl_round`): only while every stream decodes, not while the server
still prefills the later ones (scripted streams, no server, no clock asserted)."""

from __future__ import annotations

import pytest

from prfaas.commands.profile_endpoint import _itl_round
from prfaas.errors import UsageError

pytestmark = pytest.mark.timeout(10)

PREFILL_S = 0.05
STEP_S = 0.002


class _OneEngine:
    """A server that prefills the streams one after another (``PREFILL_S`` each, in the order
    asked) and decodes every stream that has its first token once per engine step: a step
    after each prefill while prefills remain, every ``STEP_S`` after. ``stream`` returns a
    stream's chunk times from its send (all sent at once)."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.asked: list[int] = []
        self._next = 0

    def stream(self, prompt: list[int], max_tokens: int, ignore_eos: bool = False) -> list[float]:
        assert ignore_eos  # exactly max_tokens each, or the streams stop at random
        i = self._next % self.batch
        self._next += 1
        if i == 0:
            self.asked.append(max_tokens)
        t = PREFILL_S * (i + 1)
        out = [t]
        while len(out) < max_tokens:
            t += PREFILL_S if t < PREFILL_S * self.batch else STEP_S
            out.append(t)
        return out


def test_the_decode_step_is_read_after_every_stream_has_its_first_token() -> None:
    engine = _OneEngine(batch=8)
    itl = _itl_round(engine, [[1] * 16 for _ in range(8)], steps=8)  # type: ignore[arg-type]
    assert itl == pytest.approx(STEP_S, rel=0.05)  # all gaps: a median of PREFILL_S
    # The first round's 8 tokens ended inside the prefills: asked again, longer.
    assert engine.asked[0] == 8 and len(engine.asked) >= 2 and engine.asked[-1] > 8 + 7


def test_a_single_stream_needs_no_second_round() -> None:
    engine = _OneEngine(batch=1)
    assert _itl_round(engine, [[1] * 16], steps=8) == pytest.approx(STEP_S)  # type: ignore[arg-type]
    assert engine.asked == [8]


def test_streams_that_never_decode_together_are_an_error() -> None:
    class Sequential:
        def stream(
            self, prompt: list[int], max_tokens: int, ignore_eos: bool = False
        ) -> list[float]:
            # Whatever it is asked, each answers two tokens, and one after the other.
            self.k = getattr(self, "k", 0) + 1
            return [10.0 * self.k, 10.0 * self.k + 0.001]

    with pytest.raises(UsageError, match="never decoded 2 streams at once"):
        _itl_round(Sequential(), [[1], [1]], steps=4)  # type: ignore[arg-type]
