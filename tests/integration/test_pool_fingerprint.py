"""A model folder's fingerprint (``engine/fingerprint.py``): the same folder gives the same one
wherever it lies; another dtype, another architecture's cache, other weights each change their
field; and the front door refuses a tenant whose model differs from its group's, naming the field
(``fingerprints`` of a pool file with a torch group)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prfaas.engine.fingerprint import model_fingerprint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from prfaas.engine.torch.tiny import make_tiny

    root = tmp_path_factory.mktemp("fp")
    out = {
        "llama": make_tiny("llama", root / "llama"),
        "llama-bf16": make_tiny("llama", root / "llama-bf16", dtype="bfloat16"),
        "llama-seed1": make_tiny("llama", root / "llama-seed1", seed=1),
        "qwen3_next": make_tiny("qwen3_next", root / "qwen3_next"),
    }
    out["llama-copy"] = Path(shutil.copytree(out["llama"], root / "elsewhere" / "llama"))
    return out


def test_each_field_follows_what_it_names(folders: dict[str, Path]) -> None:
    fp = {k: model_fingerprint("m", 64, v) for k, v in folders.items()}
    assert fp["llama"] == fp["llama-copy"]  # the folder's content, not its path
    assert fp["llama"]["dtype"] == "fp32" and fp["llama-bf16"]["dtype"] == "bf16"
    assert fp["llama-seed1"]["weights_digest"] != fp["llama"]["weights_digest"]
    assert fp["llama-seed1"]["cache_layout"] == fp["llama"]["cache_layout"]
    assert fp["qwen3_next"]["cache_layout"] != fp["llama"]["cache_layout"]
    assert model_fingerprint("m", 64) == {"config": "m", "block_tokens": "64"}


def test_the_front_door_refuses_another_checkpoint_naming_the_field(
    folders: dict[str, Path],
) -> None:
    from prfaas.policy.pool_shares import GroupShape, PoolShape, TenantShare
    from prfaas.pool.frontdoor import FrontDoor, Receiver, Submit

    shape = PoolShape((GroupShape("g", "tiny", 1),), 1e12, (TenantShare("a"),))
    door = FrontDoor(shape, 1, 30.0, {"tiny": model_fingerprint("tiny", 64, folders["llama"])})
    door.register("a", (Receiver("d0", "127.0.0.1", 9000),), 0.0)

    def submit(rid: str, folder: Path) -> tuple[int, str]:
        fp = tuple(sorted(model_fingerprint("tiny", 64, folder).items()))
        req = Submit("a", rid, "tiny", fp, 100, "d0", f"s-{rid}", 0.1, 1000)
        answer = door.submit("a", req, 0.0)
        return answer.status, getattr(answer.decision, "detail", "")

    assert submit("same", folders["llama-copy"])[0] == 200
    status, detail = submit("other", folders["llama-seed1"])
    assert status == 409 and "fingerprint.weights_digest" in detail, detail
    status, detail = submit("half", folders["llama-bf16"])
    assert status == 409 and "fingerprint." in detail, detail


def test_a_node_refuses_kv_of_another_checkpoint_naming_the_field(
    folders: dict[str, Path],
) -> None:
    """The second end: a KV manifest states the sender's model (``Node.fingerprint``), and a
    node's receiver compares it with its own before allocating anything (``WorkerHost.
    _allocate``): a pool group on other weights cannot land KV in a tenant's decode node."""
    import sys

    from prfaas.config import DeploymentConfig
    from prfaas.engine.fingerprint import engine_fingerprint
    from prfaas.serve.node.host import WorkerHost
    from prfaas.spec import get_model
    from prfaas.transfer import Manifest, Refused

    sys.path.insert(0, str(Path(__file__).parent / "serve_control"))
    from control_helpers import deployment_dict

    raw = deployment_dict()
    raw["engine"] = {"kind": "torch", "model": "tiny", "model_path": str(folders["llama"])}
    host = WorkerHost(DeploymentConfig.model_validate(raw), ["d0"], "http://127.0.0.1:9")
    try:
        assert (
            dict(host.fingerprint)["weights_digest"]
            == model_fingerprint("tiny", 512, folders["llama"])["weights_digest"]
        )
        assert all(n.fingerprint == host.fingerprint for n in host.nodes.values())
        layout = get_model("paper-1t").cache.layout(64, 0)  # refused before layers matter

        def allocate(folder: Path) -> str:
            fp = engine_fingerprint("tiny", 512, "torch", str(folder))
            with pytest.raises(Refused) as refused:
                host._allocate(Manifest.from_layout("r1", layout, fp))
            return str(refused.value)

        assert "fingerprint.weights_digest" in allocate(folders["llama-seed1"])
        assert "fingerprint." in allocate(folders["llama-bf16"])  # its weights differ first
        # The same checkpoint elsewhere passes the check (and is refused only as unexpected).
        assert "no node of" in allocate(folders["llama-copy"])
        with pytest.raises(Refused, match=r"fingerprint\.config"):
            host._allocate(Manifest.from_layout("r2", layout, (("config", "other"),)))
        with pytest.raises(Refused, match="no node of"):  # a sender stating nothing: unchecked
            host._allocate(Manifest.from_layout("r3", layout))
    finally:
        for node in host.nodes.values():
            node.close()
