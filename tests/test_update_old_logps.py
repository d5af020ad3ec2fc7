"""The old log-prob pass of `spade update` is sharded: on 2 CPU processes (torchrun, gloo) each
computes half the micro-batches, and after the gather every process holds the old log-probs one
process computes alone, bitwise (the micro-batches are the same batches, dealt round-robin)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_update import _config, make_artifacts

pytestmark = pytest.mark.integration

DRIVER = """
import json, os, sys
from spade_cli.training import trainer as update_train
from spade_cli.training.samples import collect_samples
from spade_cli.training.config import UpdateConfig

cfg = UpdateConfig(**json.loads(sys.argv[1]))
samples, _ = collect_samples(cfg)
tr = update_train.prepare(cfg, {s.temperature for s in samples}, None, cfg.model)
forwards = update_train.shard_old_logps(tr, samples, cfg.per_device_train_batch_size, 0)
out = {"rank": tr.accelerator.process_index, "forwards": forwards, "samples": len(samples),
       "old_logps": [s.old_logps for s in samples]}
with open(os.path.join(sys.argv[2], f"rank{tr.accelerator.process_index}.json"), "w") as fh:
    json.dump(out, fh)
"""


def test_sharded_old_logps_equal_one_process(tiny_model: Path, tmp_path: Path) -> None:
    from dataclasses import asdict

    art = make_artifacts(tmp_path, tiny_model)
    cfg = asdict(_config(art, tiny_model, tmp_path / "ck", per_device_train_batch_size=3))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    runs = {"one": [sys.executable, str(driver)],
            "two": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(driver)]}
    got = {}
    for name, cmd in runs.items():
        out = tmp_path / name
        out.mkdir()
        res = subprocess.run([*cmd, json.dumps(cfg), str(out)], capture_output=True, text=True, env=env, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        got[name] = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    (one,), (r0, r1) = got["one"], got["two"]
    # 15 samples in micro-batches of 3: 5 batches, 3 forwards per process (one repeat on rank 1)
    assert one["samples"] == 15 and one["forwards"] == 5 and r0["forwards"] == r1["forwards"] == 3
    assert r0["old_logps"] == one["old_logps"] and r1["old_logps"] == one["old_logps"]
    assert all(lp is not None for lp in one["old_logps"])
