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
        self._next = 0
        self.num_observed = 0

    def observe(self, num_uncached_tokens: int, num_output_tokens: int) -> None:
        if len(self._prompt) < self.size:
            self._prompt.append(num_uncached_tokens)
            self._output.append(num_output_tokens)
        else:
            self._prompt[self._next] = num_uncached_tokens
            self._output[self._next] = num_output_tokens
            self._next = (self._next + 1) % self.size
        self.num_observed += 1

    def __len__(self) -> int:
        return len(self._prompt)

    def prompt_lengths(self) -> list[int]:
        return list(self._prompt)

    def mean_output_tokens(self) -> float:
        return sum(self._output) / len(self._output) if self._output else 0.0
