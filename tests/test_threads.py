"""`--threads`: the auto rule, and the count a command's torch really runs with (flag, env, config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spade_cli.core import threads
from tests.conftest import REPO, run_spade


@pytest.mark.unit
def test_auto_rule_leaves_the_sandbox_workers_their_cores():
    assert threads.auto_threads(2, 0) == 2
    assert threads.auto_threads(16, 8) == 8
    assert threads.auto_threads(2, 8) == 1  # never below one
    env: dict[str, str] = {}
    # rollout's env steps run beside in-process generation only with continuous batching on hf
    hf_continuous = {"workers": 3, "batching": "continuous", "backend": "hf"}
    assert threads.resolve(None, "rollout", hf_continuous, env, cores=8) == (5, "auto")
    assert threads.resolve(None, "rollout", {**hf_continuous, "batching": "auto"}, env, cores=8) == (8, "auto")
    assert threads.resolve(None, "rollout", {**hf_continuous, "batching": "lockstep"}, env, cores=2) == (2, "auto")
    assert threads.resolve(None, "rollout", {**hf_continuous, "backend": "openai"}, env, cores=2) == (2, "auto")
    assert threads.resolve(None, "validate", {"workers": None}, env, cores=4) == (1, "auto")  # 2 per core
    assert threads.resolve(None, "validate", {"workers": 1}, env, cores=4) == (3, "auto")
    assert threads.resolve(None, "warmstart", {"agent_episodes": 0}, env, cores=4) == (4, "auto")
    # its solver episodes run in the sandbox before training, not beside it
    assert threads.resolve(None, "warmstart", {"agent_episodes": 2}, env, cores=12) == (12, "auto")
    assert threads.resolve(None, "update", {}, env, cores=6) == (6, "auto")


@pytest.mark.unit
def test_an_explicit_count_wins_and_an_exported_omp_count_beats_auto():
    assert threads.resolve(3, "rollout", {"workers": 8}, {"OMP_NUM_THREADS": "1"}, cores=2) == (3, "option")
    assert threads.resolve(None, "update", {}, {"OMP_NUM_THREADS": "1"}, cores=8) == (1, "OMP_NUM_THREADS")
    assert threads.resolve(None, "update", {}, {"OMP_NUM_THREADS": "junk"}, cores=8) == (8, "auto")
    assert threads.parse("auto") is None and threads.parse(None) is None and threads.parse(" 4 ") == 4
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError):
            threads.parse(bad)


# A command built exactly as spade builds its own (SpadeCommand, the shared --config), named
# `rollout` so that the auto rule reads its --workers; it reports what its torch runs with.
PROBE = r"""
import json, os, sys
import typer
from spade_cli.cli import ConfigOpt, SpadeCommand, resolved_config
app = typer.Typer()
def rollout(ctx: typer.Context, workers: int = typer.Option(8, "--workers"),
            batching: str = typer.Option("continuous", "--batching"), backend: str = typer.Option("hf", "--backend"),
            use_torch: bool = typer.Option(False, "--torch"), config: ConfigOpt = None) -> None:
    from spade_cli.core import threads
    out = {"omp": os.environ.get("OMP_NUM_THREADS"), "mkl": os.environ.get("MKL_NUM_THREADS"),
           "config": resolved_config(ctx)}
    if use_torch:
        import torch
        out["torch"] = torch.get_num_threads()
    out.update(threads.recorded())
    print(json.dumps(out))
app.command("rollout")(rollout)
app.command("other")(lambda: None)
for info in app.registered_commands:
    info.cls = SpadeCommand
app(prog_name="probe")
"""


def _probe(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SPADE_THREADS")}
    return subprocess.run([sys.executable, "-c", PROBE, "rollout", *args], capture_output=True, text=True,
                          cwd=REPO, env={**base, **(env or {})}, timeout=300)


@pytest.mark.integration
def test_the_flag_sets_torch_threads_after_import():
    res = _probe("--threads", "3", "--torch", env={"OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["torch"] == out["torch_threads"] == 3 and out["omp"] == out["mkl"] == "3"
    # torch reads no environment variable for its inter-op pool: only the post-import hook sets it
    assert out["torch_interop_threads"] == 3
    assert out["source"] == "option"
    assert "threads" not in out["config"]  # non-semantic: not part of the manifest comparison


@pytest.mark.integration
def test_env_var_config_and_auto(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("threads: 3\n")
    out = json.loads(_probe("--config", str(cfg)).stdout)
    assert (out["requested"], out["omp"]) == (3, "3")
    out = json.loads(_probe(env={"SPADE_THREADS": "4"}).stdout)
    assert (out["requested"], out["source"]) == (4, "option")
    out = json.loads(_probe("--threads", "5", env={"SPADE_THREADS": "4"}).stdout)
    assert out["requested"] == 5  # the flag beats the environment
    out = json.loads(_probe("--workers", "1").stdout)
    assert out["source"] == "auto" and out["requested"] == max(1, threads.usable_cores() - 1)
    res = _probe("--threads", "zero")
    assert res.returncode == 2 and "positive integer or 'auto'" in res.stderr


@pytest.mark.slow
def test_init_model_reports_the_threads_its_torch_ran_with(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("threads: 2\n")
    res = run_spade("init-model", "--out", tmp_path / "m", "--config", cfg)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["threads"]["torch_threads"] == 2 and summary["threads"]["source"] == "option"
