"""``prfaas.engine.torch``: real model execution with Hugging Face transformers on PyTorch.

The only part of ``prfaas.engine`` that imports torch. ``TorchEngine.from_folder(dir)`` loads a
local model folder (config, safetensors, tokenizer); see ``docs/engine.md``.
"""

from prfaas.engine.torch.engine import TorchEngine
from prfaas.engine.torch.loader import LoadedModel, load_model

__all__ = ["LoadedModel", "TorchEngine", "load_model"]
