"""Errors the engines raise. Each names the bad value; none leaves anything half-installed.

Every class subclasses ``prfaas.errors.UsageError`` when the mistake is the user's (a model folder,
an architecture name, a prompt), so the CLI prints one line and exits 2. Imports nothing heavy.
"""

from __future__ import annotations

from prfaas.errors import UsageError


class EngineError(Exception):
    """Base class of everything an engine refuses."""


class UnknownArchitecture(EngineError, UsageError):
    """A ``model_type`` / ``--arch`` this engine cannot run."""


class ModelFolderError(EngineError, UsageError):
    """A model folder that is missing files or holds an unreadable config."""


class PromptTooLong(EngineError, UsageError):
    """Prompt plus tokens to generate exceed the model's maximum context."""


class ManifestMismatch(EngineError):
    """An incoming cache whose layout does not match the model (layer count, kind, dtype, shape)."""


class BudgetExceeded(EngineError):
    """Admitting a request would push the KV cache past the engine's byte budget."""


class UnknownRequest(EngineError):
    """A request id the engine does not hold (or holds in another state)."""


class EngineDead(EngineError):
    """The engine's thread has stopped (it died, or the engine was closed): nothing more runs.
    The message is the engine's ``fault``."""
