"""``LengthWindow``: the last N requests' uncached prompt and output lengths, as a ring buffer.

Drivers feed it (``observe``); the threshold tuner and the rebalancer read it. Pure.
"""

from __future__ import annotations


class LengthWindow:
    def __init__(self, size: int = 2048) -> None:
        if size <= 0:
            raise ValueError(f"window size must be > 0, got {size}")
        self.size = size
        self._prompt: list[int] = []
        self._output: list[int] = []
        self._time: list[float] = []
        self._next = 0
        self.num_observed = 0

    def observe(self, num_uncached_tokens: int, num_output_tokens: int, now: float = 0.0) -> None:
        if len(self._prompt) < self.size:
            self._prompt.append(num_uncached_tokens)
            self._output.append(num_output_tokens)
            self._time.append(now)
        else:
            i = self._next
            self._prompt[i] = num_uncached_tokens
            self._output[i] = num_output_tokens
            self._time[i] = now
            self._next = (i + 1) % self.size
        self.num_observed += 1

    def __len__(self) -> int:
        return len(self._prompt)

    def prompt_lengths(self) -> list[int]:
        return list(self._prompt)

    def rate_rps(self) -> float:
        """Observed arrival rate over the window (0 until two distinct times were seen)."""
        n = len(self._time)
        if n < 2:
            return 0.0
        newest = self._time[self._next - 1] if n == self.size else self._time[-1]
        oldest = self._time[self._next] if n == self.size else self._time[0]
        span = newest - oldest
        return (n - 1) / span if span > 0 else 0.0

    def mean_output_tokens(self) -> float:
        return sum(self._output) / len(self._output) if self._output else 0.0
