"""prfaas.netlab: a two-site network on one machine (namespaces, a tbf-shaped veth, a userspace
delay line for the RTT), what ``prfaas up`` places a ``netns: true`` deployment's PrfaaS site in
(``serve.launch_netns``), and what the transfer e2e tests and ``bench/transfer.py`` measure over.

Below ``serve/``: imports nothing of prfaas (stdlib, ``ip``/``tc``, helper processes; root only).
Test harnesses (vLLM servers for the e2e tests) stay in ``prfaas.testbed``, outside the product
path.
"""

from prfaas.netlab.netns import TwoSiteTestbed, sweep_stale, unavailable_reason

__all__ = ["TwoSiteTestbed", "sweep_stale", "unavailable_reason"]
