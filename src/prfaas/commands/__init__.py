"""Subcommands of the ``prfaas`` CLI, one module each (see ``prfaas.cli``)."""
