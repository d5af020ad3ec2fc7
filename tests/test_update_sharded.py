"""`spade update` sharded: the FSDP2 recipe through `accelerate launch` on 2 CPU processes (gloo).

accelerate hands FSDP only to accelerator devices: with ``use_cpu`` it runs plain multi-CPU data
parallelism whatever the config says. So the test puts one shim on the processes' path (a
``sitecustomize`` that makes accelerate's backend choice answer "gloo, multi-device" and its device
the CPU); the rest is the real thing: recipes/accelerate/fsdp.yaml as shipped but for bf16 and the
process count, accelerate's launcher and FSDP2 preparation (fully_shard, rank-0 loading),
torch.distributed.checkpoint for the sharded trainer state, and spade's per-parameter gather.

Three chained updates, each resuming the previous one's sharded state, end with the weights of one
process taking the same three updates; the audit (each process's share, reduced) agrees with the
single-process audit; the audit snapshots are split across the processes, not copied into each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, run_spade
from tests.test_update import _changed, _params, make_artifacts

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # minutes of CPU: CI's second tier

SHIM = """
import torch
from accelerate import state
from accelerate.utils import DistributedType

def _backend(self, cpu=False, sagemaker_dp=False, backend=None):
    return "gloo", DistributedType.MULTI_GPU

def _set_device(self):
    if self.device is None:
        self.device = torch.device("cpu")

state.PartialState._prepare_backend = _backend
state.PartialState.set_device = _set_device
"""
# The bound docs/update.md states for host memory: each of 2 FSDP processes peaks no higher than
# this factor of one process doing the whole update. Measured from 0.91 to above 1.15 on the small
# model across runs of a loaded 2-core machine, where the processes' fixed runtime and the allocator's
# noise dominate: a coarse check that catches a process holding several models' worth more (the
# model's fp32 weights are 50 MB, 10% of what one process adds), the exact one being the split of the
# audit copies in the test above.
PER_PROCESS_FACTOR = 1.3


@pytest.fixture(scope="module")
def artifacts(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_artifacts(tmp_path_factory.mktemp("sharded_inputs"), tiny_model)


def _launch(tmp: Path) -> tuple[list[str], dict]:
    import yaml

    cfg = yaml.safe_load((REPO / "recipes" / "accelerate" / "fsdp.yaml").read_text())
    cfg.update(mixed_precision="no", num_processes=2)
    config = tmp / "fsdp_gloo.yaml"
    config.write_text(yaml.safe_dump(cfg))
    site = tmp / "shim"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SHIM)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "400",
           "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "-m", "spade_cli"], env


def _common(artifacts: dict) -> list[str]:
    return ["--rollouts", str(artifacts["rollouts"]), "--envs", str(artifacts["validated"]), "--scores",
            str(artifacts["scores"]), "--learning-rate", "1e-3", "--seed", "0"]


def test_three_chained_fsdp_updates_on_two_processes_equal_one(artifacts: dict, tiny_model: Path,
                                                               tmp_path: Path) -> None:
    launch, env = _launch(tmp_path)
    one_prev = two_prev = tiny_model
    for i in range(1, 4):
        one, two = tmp_path / f"one_{i}", tmp_path / f"two_{i}"
        res = run_spade("update", "--model", one_prev, "--out", one, "--per-device-train-batch-size", "4",
                        *_common(artifacts))
        assert res.returncode == 0, res.stderr
        res = subprocess.run([*launch, "update", "--model", str(two_prev), "--out", str(two),
                              "--per-device-train-batch-size", "2", *_common(artifacts)],
                             capture_output=True, text=True, env=env, timeout=900)
        assert res.returncode == 0, res.stderr[-4000:]
        summary = json.loads(res.stdout.strip().splitlines()[-1])
        assert summary["resumed_state"] == (None if i == 1 else str(two_prev / "trainer_state"))
        one_prev, two_prev = one, two

    reports = {n: json.loads((tmp_path / f"{n}_3" / "update.json").read_text()) for n in ("one", "two")}
    assert reports["two"]["metrics"]["processes"] == 2
    assert reports["two"]["trainer_state"]["updates"] == 3
    meta = json.loads((tmp_path / "two_3" / "trainer_state" / "spade_state.json").read_text())
    assert meta["distributed_type"] == "DistributedType.FSDP" and meta["processes"] == 2
    # Tolerance: the two runs sum the same gradients in another order, and Adam turns float noise on
    # near-zero gradients into full steps; over three updates the disagreement stays below 5% of
    # the distance the weights moved.
    base, one_w, two_w = _params(tiny_model), _params(tmp_path / "one_3"), _params(tmp_path / "two_3")
    moved = _changed(base, one_w)
    assert moved > 0 and _changed(one_w, two_w) < 0.05 * moved, (_changed(one_w, two_w), moved)
    a1, a2 = reports["one"]["audit"], reports["two"]["audit"]
    assert a2["elements"] == a1["elements"] > 0
    assert a2["master_update_l2"] == pytest.approx(a1["master_update_l2"], rel=0.05)
    assert a2["changed_fraction"] == pytest.approx(a1["changed_fraction"], abs=0.02)
    assert a2["rounding_lost_fraction"] == pytest.approx(0.0, abs=1e-6)  # fp32 served: nothing rounded
    # the served checkpoint is the masters: what the audit measured is what the next update loads
    assert a2["residual_l2"] == pytest.approx(0.0, abs=1e-6)

    # the audit snapshots (served before, masters before) are split between the processes
    held = [[p["snapshots_mb"] for p in reports[n]["host_memory"]["per_process"]] for n in ("one", "two")]
    assert len(held[1]) == 2 and all(0 < h < 0.75 * held[0][0] for h in held[1]), held
    assert sum(held[1]) == pytest.approx(held[0][0], rel=0.01), held


def test_host_memory_per_process_does_not_grow_with_the_process_count(tmp_path: Path,
                                                                       _offline_caches: None) -> None:
    """The small model (12.5M parameters), one update: each of 2 FSDP processes peaks no higher than
    one process doing it all (within PER_PROCESS_FACTOR), so a node's memory is the processes'
    fixed runtime plus one share of the model each, not one model each."""
    from spade_cli.models import tinymodel

    small = tmp_path / "small"
    tinymodel.build(small, size="small", seed=0)
    artifacts = make_artifacts(tmp_path, small)
    launch, env = _launch(tmp_path)
    res = run_spade("update", "--model", small, "--out", tmp_path / "one", "--per-device-train-batch-size", "4",
                    *_common(artifacts))
    assert res.returncode == 0, res.stderr
    res = subprocess.run([*launch, "update", "--model", str(small), "--out", str(tmp_path / "two"),
                          "--per-device-train-batch-size", "2", *_common(artifacts)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    one, two = (json.loads((tmp_path / n / "update.json").read_text())["host_memory"] for n in ("one", "two"))
    added = lambda p: p["peak_mb"] - p["before_load_mb"]  # noqa: E731
    single = added(one["per_process"][0])
    print("host memory added (MB): one process", single, "; two:", [added(p) for p in two["per_process"]])
    assert len(two["per_process"]) == 2
    assert all(added(p) <= PER_PROCESS_FACTOR * single for p in two["per_process"]), (one, two)


def test_a_kl_reference_under_fsdp_is_whole_on_every_process(artifacts: dict, tiny_model: Path,
                                                              tmp_path: Path) -> None:
    """The KL reference is not wrapped by FSDP: every process must hold all of it (not a rank-0-only
    load left on the meta device elsewhere). Two processes measure the KL one process measures."""
    launch, env = _launch(tmp_path)
    kl = ["--beta", "0.5", "--kl-agent", "0.1"]
    res = run_spade("update", "--model", tiny_model, "--out", tmp_path / "one", "--per-device-train-batch-size", "4",
                    *kl, *_common(artifacts))
    assert res.returncode == 0, res.stderr
    res = subprocess.run([*launch, "update", "--model", str(tiny_model), "--out", str(tmp_path / "two"),
                          "--per-device-train-batch-size", "2", *kl, *_common(artifacts)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    one, two = (json.loads((tmp_path / n / "update.json").read_text()) for n in ("one", "two"))
    assert two["metrics"]["processes"] == 2 and two["kl_reference"]["via"] == "copy"
    for role in ("agent", "designer"):
        assert two["roles"][role]["kl"] > 0
        assert two["roles"][role]["kl"] == pytest.approx(one["roles"][role]["kl"], rel=0.05)
