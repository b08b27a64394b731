"""prfaas.testbed: test harnesses, outside the product path (nothing under ``serve/`` imports
it). ``vllm_servers``: vLLM servers for the vLLM e2e tests and ``bench/vllm_pd.py``. The two-site
network (namespaces, tbf, the delay line) is ``prfaas.netlab``.
"""
