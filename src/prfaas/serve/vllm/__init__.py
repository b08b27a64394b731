"""The vLLM sidecar: a node process of a vLLM site (``engine: {kind: vllm}``) that starts,
supervises and stops one vLLM OpenAI server for all of its nodes and speaks the ordinary node API
to the gateway (``docs/vllm.md``, contract in issue 12).

``server``: the server's command line and environment, start, health wait, restart with backoff,
stop by process group. ``metrics``: vLLM's Prometheus ``/metrics`` as figures. ``agent``: the
client of the connector's agent socket (transfer outcomes, link figures). ``node``: a node's
prefill / decode / abort / report on vLLM. ``host``: the process (nodes, server, registration and
heartbeats). Imports neither vllm nor torch: the sidecar runs in the project's venv and drives
vLLM over HTTP.
"""
