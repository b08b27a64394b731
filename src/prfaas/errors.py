"""Errors a user can cause. The CLI turns ``UsageError`` into one line on stderr and exit 2."""


class UsageError(Exception):
    """Bad input from the user (a flag, a file, a preset name): the message names the bad value."""
