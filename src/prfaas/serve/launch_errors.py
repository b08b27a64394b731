"""The launcher's errors, in their own module so that the launcher's parts can raise them.

``LaunchError``: the deployment did not (or cannot) come up; ``LaunchCancelled``: a start-up
stopped by ``Launcher.cancel()``. Imports nothing of prfaas.
"""

from __future__ import annotations


class LaunchError(RuntimeError):
    """The deployment did not come up; the message says which process and shows its log tail."""


class LaunchCancelled(LaunchError):
    """``cancel()`` was called during start-up (Ctrl-C, SIGTERM): what was started is stopped."""
