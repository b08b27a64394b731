"""Element types of cached tensors and their sizes. Pure."""

from __future__ import annotations

import enum


class DType(enum.Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"

    @property
    def num_bytes(self) -> int:
        return _SIZES[self]

    @classmethod
    def parse(cls, name: str) -> DType:
        aliases = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8": "fp8"}
        key = aliases.get(name.lower(), name.lower())
        try:
            return cls(key)
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown dtype {name!r} (known: {known})") from None


_SIZES = {DType.BF16: 2, DType.FP16: 2, DType.FP32: 4, DType.FP8: 1}
