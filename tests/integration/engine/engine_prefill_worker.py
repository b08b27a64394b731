"""Helper process for the cross-process test: prefill, export, write the cache to files.

Usage: python engine_prefill_worker.py OUT_DIR ARCH:DTYPE:MODEL_DIR ...
Writes OUT_DIR/ARCH-DTYPE.bin (every layer's bytes in layout order) and .json (first token).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch

from prfaas.engine import PrefillRequest, SamplingParams
from prfaas.engine.torch import TorchEngine
from prfaas.spec import DType


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    num_tokens, new_tokens = int(sys.argv[2]), int(sys.argv[3])
    for case in sys.argv[4:]:
        arch, dtype, model_dir = case.split(":", 2)
        engine = TorchEngine.from_folder(model_dir, DType.parse(dtype))
        rng = random.Random(0)
        prompt = tuple(rng.randrange(2, 500) for _ in range(num_tokens))
        sampling = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
        result = engine.prefill(PrefillRequest("xp", prompt, sampling))
        with open(out / f"{arch}-{dtype}.bin", "wb") as f:
            for layer in engine.export("xp"):
                for buf in layer.buffers:
                    f.write(buf)
        (out / f"{arch}-{dtype}.json").write_text(json.dumps({"first_token": result.first_token}))


if __name__ == "__main__":
    main()
