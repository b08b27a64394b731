"""A model folder's fingerprint (``pool/fingerprint.py``): the same folder gives the same one
wherever it lies; another dtype, another architecture's cache, other weights each change their
field; and the front door refuses a tenant whose model differs from its group's, naming the field
(``fingerprints`` of a pool file with a torch group)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prfaas.pool.fingerprint import model_fingerprint

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
