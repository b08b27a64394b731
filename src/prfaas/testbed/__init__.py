"""prfaas.testbed: a two-site network on one machine (namespaces, tbf, a userspace delay line).

Used by the transfer e2e tests and ``bench/transfer.py`` now, and by the live system later.
Not a pure layer: it runs ``ip``/``tc`` and helper processes (root only). ``vllm_servers`` (not
imported here): vLLM servers for the vLLM e2e tests and ``bench/vllm_pd.py``.
"""

from prfaas.testbed.netns import TwoSiteTestbed, sweep_stale, unavailable_reason

__all__ = ["TwoSiteTestbed", "sweep_stale", "unavailable_reason"]
