"""A checkpoint is checked complete before any stage loads it (spade_cli.core.checkpoint).

Unit: each way a directory can be incomplete, on copies of the tiny model, and a sharded one.
Integration: a really truncated ``model.safetensors`` through the CLI: `spade update` refuses it
(also on the no-signal path, which would otherwise republish it as a finished checkpoint) and
`spade design` (the hf backend) names it in one line instead of a safetensors traceback.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from spade_cli.core import checkpoint
from spade_cli.core.errors import InputError
from tests.conftest import run_spade


@pytest.fixture
def copy(tiny_model: Path, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(tiny_model, out)
    return out


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


@pytest.mark.unit
def test_a_complete_checkpoint_and_a_hub_id_pass(copy: Path) -> None:
    checkpoint.check(copy)
    checkpoint.check("Qwen/Qwen3-0.6B")  # not a directory: the loader's business


@pytest.mark.unit
@pytest.mark.parametrize(("damage", "message"), [
    (lambda d: _truncate(d / "model.safetensors"), "truncated safetensors file: its tensors need"),
    (lambda d: _truncate(d / "model.safetensors", 0.0001), "truncated safetensors file: its header declares"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x01\x02"), "not even a header"),
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes() + b"\0" * 8),
     "8 bytes follow the last tensor"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x04" + b"\0" * 7 + b"{no}"), "header is not valid JSON"),
    (lambda d: (d / "config.json").unlink(), "config.json is missing"),
    (lambda d: (d / "config.json").write_text("{"), "config.json: unreadable or not JSON"),
    (lambda d: (d / "model.safetensors").unlink(), "no weights"),
])
def test_each_kind_of_damage_is_named(copy: Path, damage, message: str) -> None:
    damage(copy)
    with pytest.raises(InputError, match=message) as err:
        checkpoint.check(copy)
    assert str(copy) in str(err.value)


@pytest.mark.unit
def test_a_sharded_checkpoint_needs_every_shard_and_tensor(copy: Path) -> None:
    from transformers import AutoModelForCausalLM

    sharded = copy.parent / "sharded"
    AutoModelForCausalLM.from_pretrained(copy).save_pretrained(sharded, max_shard_size="200KB")
    index = sharded / "model.safetensors.index.json"
    shards = sorted({*json.loads(index.read_text())["weight_map"].values()})
    assert len(shards) > 1
    checkpoint.check(sharded)
    weight_map = json.loads(index.read_text())["weight_map"]
    index.write_text(json.dumps({"weight_map": {**weight_map, "extra.weight": shards[0]}}))
    with pytest.raises(InputError, match=f"{shards[0]}: lacks the tensor 'extra.weight'"):
        checkpoint.check(sharded)
    index.write_text(json.dumps({"weight_map": weight_map}))
    (sharded / shards[-1]).unlink()
    with pytest.raises(InputError, match=f"names the shard '{shards[-1]}'"):
        checkpoint.check(sharded)


@pytest.mark.integration
def test_update_and_design_refuse_a_truncated_checkpoint(copy: Path, tmp_path: Path) -> None:
    from tests.test_update import make_artifacts

    art = make_artifacts(tmp_path, copy)  # from the whole model, before the damage
    weights = copy / "model.safetensors"
    _truncate(weights)
    flat = tmp_path / "flat.jsonl"  # every episode earns the same: no signal, the unchanged path
    flat.write_text("".join(json.dumps({**json.loads(ln), "return": 0.0}) + "\n"
                            for ln in art["rollouts"].read_text().splitlines()))
    for rollouts in (flat, art["rollouts"]):
        out = tmp_path / "ck"
        res = run_spade("update", "--model", copy, "--rollouts", rollouts, "--out", out)
        assert res.returncode == 1, res.stderr
        assert f"error: {weights}: truncated safetensors file" in res.stderr and "Traceback" not in res.stderr
        assert not out.exists() and not list(tmp_path.glob(".ck*")) and res.stdout == ""
    res = run_spade("design", "--n", "2", "--group", "2", "--model", copy, "--no-grounding",
                    "--max-tokens", "4", "--out", tmp_path / "designs.jsonl")
    assert res.returncode == 1 and f"{weights}: truncated safetensors file" in res.stderr, res.stderr
    assert not (tmp_path / "designs.jsonl").exists()
