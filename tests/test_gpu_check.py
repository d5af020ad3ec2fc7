"""recipes/gpu_check.sh on its CPU path (DRY=1): the same steps as on a GPU machine, a toy shape.

Checks that the prepared script runs end to end offline (build on the device, episodes, two chained
updates under `accelerate launch`, the second resuming) and prints its one JSON line; the figures
of a dry run are no measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_the_dry_run_prints_one_json_line_with_both_updates(tmp_path: Path, _offline_caches: None) -> None:
    env = {**os.environ, "DRY": "1", "WORK": str(tmp_path / "w"), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(["bash", str(REPO / "recipes" / "gpu_check.sh")], capture_output=True, text=True,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1, res.stdout
    out = json.loads(lines[0])
    assert out["dry"] is True and out["build"]["device"] == "cpu" and out["build"]["params"] > 0
    first, second = out["updates"]
    assert not first["resumed"] and second["resumed"]
    for u in (first, second):
        assert u["processes"] == 1 and u["tokens_per_s"] > 0 and u["s_per_step"] > 0 and u["optimizer_steps"] == 4
        assert u["host_peak_mb"] > 0 and u["state_bytes"] > 0
    assert second["state_load_s"] is not None
    # the generation check (recipes/gpu_check_generation.sh) runs too, and skips without CUDA
    assert out["generation"] == {"status": "skipped", "why": "no CUDA device or no vllm"}
