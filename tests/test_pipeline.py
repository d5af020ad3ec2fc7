"""Pipelined iterations, the quick parts (docs/pipeline.md): how far behind the trained checkpoint an
update's samples were drawn, the bound on it, and the run directory's loop mode.

The staleness figures are read from what the stages write: a rollout file's manifest names the
checkpoint that played it, a design row's ``gen.model`` the one that wrote it, and a checkpoint's
``update.json`` the checkpoint it was trained from (``config.model``). The lineage here is built
from those files by hand (a real chain of updates is in tests/test_loop_pipelined.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spade_cli.core.artifacts import SpadeError
from spade_cli.training import staleness as update_staleness
from tests.conftest import REPO


def _ckpt(path: Path, parent: str | None) -> str:
    path.mkdir(parents=True)
    if parent is not None:
        (path / "update.json").write_text(json.dumps({"config": {"model": parent}}))
    return str(path)


def _rollouts(path: Path, model: str | None) -> str:
    path.write_text("")
    if model is not None:
        Path(f"{path}.manifest.json").write_text(json.dumps({"stage": "rollout", "config": {"model": model}}))
    return str(path)


@pytest.fixture
def chain(tmp_path: Path) -> list[str]:
    """base (not a directory: a hub id) -> c1 -> c2 -> c3"""
    c1 = _ckpt(tmp_path / "ckpt" / "iter_0001", "org/base")
    c2 = _ckpt(tmp_path / "ckpt" / "iter_0002", c1)
    return ["org/base", c1, c2, _ckpt(tmp_path / "ckpt" / "iter_0003", c2)]


def test_behind_counts_updates_along_the_lineage(chain: list[str]) -> None:
    base, c1, c2, c3 = chain
    assert update_staleness.behind(c3, c3) == 0
    assert update_staleness.behind(c2, c3) == 1
    assert update_staleness.behind(base, c3) == 3
    assert update_staleness.behind(c3, c1) is None  # a later checkpoint is no ancestor
    assert update_staleness.behind("org/other", c3) is None
    # the same directory spelt another way is the same checkpoint
    assert update_staleness.behind(str(Path(c2) / ".." / "iter_0002"), c3) == 1


def test_measure_reports_each_role_and_the_largest(chain: list[str], tmp_path: Path) -> None:
    base, c1, c2, _ = chain
    shards = [_rollouts(tmp_path / "r0.jsonl", c1), _rollouts(tmp_path / "r1.jsonl", c1)]
    designs = tmp_path / "validated.jsonl"
    row = {"schema": "spade.validation/1", "code": "x", "hint": "h", "valid": True, "reason": None, "checks": [],
           "tokens": {"prompt_ids": [1], "completion_ids": [2], "logprobs": [-0.5]}, "gen": {"model": base}}
    designs.write_text(json.dumps(row) + "\n" + json.dumps({**row, "tokens": None, "gen": None}) + "\n")
    report = update_staleness.measure(c2, shards, [str(designs)])
    assert report["agent"] == {"sampled_by": [{"model": c1, "behind": 1, "files": shards}], "behind": 1}
    assert report["designer"]["behind"] == 2 and report["behind"] == 2
    update_staleness.check(report, 2)
    with pytest.raises(SpadeError, match=r"validated.jsonl: the designer samples .* 2 updates behind"):
        update_staleness.check(report, 1)


def test_a_sampler_that_cannot_be_traced_is_unknown_and_refused_under_a_bound(chain: list[str],
                                                                              tmp_path: Path) -> None:
    _, c1, c2, _ = chain
    report = update_staleness.measure(c2, [_rollouts(tmp_path / "r.jsonl", None)], [])
    assert report["agent"]["behind"] is None and report["behind"] is None
    update_staleness.check(report, None)  # no bound: recorded only
    with pytest.raises(SpadeError, match="an unknown number of updates"):
        update_staleness.check(report, 1)


def _loop(cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MODEL": "org/base",
               "RUN": "run", **env}
    return subprocess.run(["bash", str(REPO / "recipes" / "loop.sh")], cwd=cwd, env=environ, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.integration
def test_the_two_loops_never_mix_in_one_run_directory(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "loop_mode").write_text("pipelined 1\n")
    res = _loop(tmp_path, PIPELINE="0")
    assert res.returncode == 2 and "made by the pipelined 1 loop and this is the sequential one" in res.stderr
    res = _loop(tmp_path, PIPELINE="1", STALENESS="2")
    assert res.returncode == 2 and "this is the pipelined 2 one" in res.stderr
    # a run made before modes were recorded is sequential
    old = tmp_path / "old"
    (old / "run" / "iter_0000").mkdir(parents=True)
    res = _loop(old, PIPELINE="1")
    assert res.returncode == 2 and "made by the sequential loop" in res.stderr
    assert not (old / "run" / "loop_mode").exists()
    res = _loop(tmp_path, PIPELINE="2")
    assert res.returncode == 2 and "PIPELINE must be 0 or 1" in res.stderr


def _schedule(tmp_path: Path, keep: tuple[str, ...] = ("rollout", "update", "eval"),
              **env: str) -> list[tuple[str, str, str]]:
    """The stages the real loop runs, in order, as (stage, --model, --out) with the benchmark's stand-in
    stages (recipes/bench_pipeline.py): the schedule without the cost of running it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_pipeline", REPO / "recipes" / "bench_pipeline.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tmp_path.mkdir(exist_ok=True)
    spade = tmp_path / "spade"
    trace = 'echo "$cmd ${opt[--model]:--} ${opt[--out]:--}" >>"$TRACE"\ncase $cmd in'
    spade.write_text(bench.STAND_IN.replace("case $cmd in", trace, 1))
    spade.chmod(0o755)
    environ = {**os.environ, "BENCH_TRAIN_S": "0",
               **{f"BENCH_{k.upper()}_S": "0" for k in bench.GEN_SHARE}, "TRACE": str(tmp_path / "trace"),
               "SPADE": str(spade), "UPDATE_CMD": str(spade), "MODEL": "base", "RUN": str(tmp_path / "run"), **env}
    res = subprocess.run(["bash", str(REPO / "recipes" / "loop.sh")], env=environ, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [line.replace(f"{tmp_path}/run/", "").split() for line in (tmp_path / "trace").read_text().splitlines()]
    return [(s, m.replace("ckpt/iter_000", "c"), o) for s, m, o in rows if s in keep]


@pytest.mark.parametrize("staleness", [1, 2])
def test_iteration_i_samples_from_checkpoint_i_minus_staleness_and_evaluations_keep_their_place(
        tmp_path: Path, staleness: int) -> None:
    steps = _schedule(tmp_path, PIPELINE="1", STALENESS=str(staleness), ITERS="4", EVAL_EVERY="2")
    sampled = {int(o.split("/")[0][-1]): m for s, m, o in steps if s == "rollout"}
    assert sampled == {i: "base" if i <= staleness else f"c{i - staleness}" for i in range(4)}
    assert [(m, o) for s, m, o in steps if s == "update"] == \
        [("base", "ckpt/iter_0001")] + [(f"c{i}", f"ckpt/iter_000{i + 1}") for i in (1, 2, 3)]
    # every evaluation of the sequential loop (the model, every 2nd checkpoint, the last), none twice
    assert sorted(m for s, m, _ in steps if s == "eval") == ["base", "c2", "c4"]
    # update(i) is started before the generation of iteration i + staleness (they overlap) ...
    order = [(s, o) for s, _, o in steps]
    for i in range(4 - staleness):
        assert order.index(("update", f"ckpt/iter_000{i + 1}")) < \
            order.index(("rollout", f"iter_000{i + staleness}/rollouts.jsonl"))
    # ... and the sequential loop runs the same stages one after the other, each with its own checkpoint
    seq = _schedule(tmp_path / "seq", PIPELINE="0", ITERS="4", EVAL_EVERY="2")
    assert {int(o.split("/")[0][-1]): m for s, m, o in seq if s == "rollout"} == \
        {0: "base", 1: "c1", 2: "c2", 3: "c3"}


@pytest.mark.parametrize("staleness", [1, 2])
def test_one_engine_serves_each_stage_its_checkpoint_as_soon_as_the_update_that_wrote_it_has_ended(
        tmp_path: Path, staleness: int) -> None:
    """ENGINE=serve, pipelined (docs/pipeline.md "One engine"): before each sampling stage the lane
    has the server serve that stage's checkpoint; checkpoint k is loaded once update(k) has started,
    which the loop does only after update(k-1), which wrote it, has ended; then the server is stopped.
    (tests/test_loop_serve.py runs this against a server and compares the times.)"""
    steps = _schedule(tmp_path, keep=("serve", "design", "rollout", "update", "eval"), PIPELINE="1",
                      STALENESS=str(staleness), ITERS="4", EVAL_EVERY="2", ENGINE="serve", CUDA_VISIBLE_DEVICES="")
    served = None
    for s, m, o in steps:
        if s == "serve":
            served = m
        elif s != "update":
            assert m == served, f"{s} {o} samples from {m} while the server serves {served}"
    calls = [m for s, m, _ in steps if s == "serve"]
    loads = [m for k, m in enumerate(calls) if m != "-" and (k == 0 or m != calls[k - 1])]
    assert loads == ["base", "c1", "c2", "c4"]  # c3 samples nothing: no generation of iteration 4, no eval
    order = [(s, m) for s, m, _ in steps]
    assert order[-1] == ("serve", "-")  # --do stop
    for k in (1, 2):  # update(k) runs, so update(k-1) has ended, and the load comes at once, beside it
        assert order.index(("update", f"c{k}")) < order.index(("serve", f"c{k}")) < order.index(("update", f"c{k + 1}"))
