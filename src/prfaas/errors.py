"""Errors the CLI reports in one line on stderr, without a traceback: ``UsageError`` (exit 2) and
``MeasurementError`` (exit 1)."""


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a preset name): the message names the bad value."""


class MeasurementError(Exception):
    """A measurement ran and its result cannot be used (on a busy machine, noise the fits cannot
    take): nothing was written; the message says what was wrong and what to do."""
