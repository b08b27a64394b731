"""Node processes: prefill and decode workers around an engine and the transfer library.

A worker process hosts one or more nodes of one site (several emulated ``timed`` nodes share a
process so a dozen fit on 2 cores; a ``torch`` node has a process of its own). It serves the
gateway's internal HTTP API (``node.app``), registers its nodes and heartbeats their load.
"""
