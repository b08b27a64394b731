"""serve.loadgen: the load client behind ``prfaas bench``.

``workload`` builds the requests (synthetic arrivals x truncated log-normal lengths, or a
Mooncake trace) with deterministic prompts; ``client`` sends one streaming completion and times it;
``runner`` replays a workload at its arrival times with bounded concurrency; ``report`` turns
results into the summary (throughput, TTFT / per-token latency percentiles, failures by reason);
``export`` joins results with a gateway's route log into per-request rows and trace spans.
Talks HTTP to any OpenAI-compatible endpoint; imports nothing of the gateway.
"""

from prfaas.serve.loadgen.client import RequestResult
from prfaas.serve.loadgen.report import summarize
from prfaas.serve.loadgen.runner import run_workload
from prfaas.serve.loadgen.workload import (
    BenchRequest,
    PromptSynth,
    synthetic_workload,
    trace_workload,
)

__all__ = [
    "BenchRequest",
    "PromptSynth",
    "RequestResult",
    "run_workload",
    "summarize",
    "synthetic_workload",
    "trace_workload",
]
