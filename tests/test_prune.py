"""Retention: `spade prune` on a synthetic run (which checkpoint and state goes, which stays and why),
what it owns (links at every level, directories and manifests spade did not write, user files, live
servers of the run, concurrent stages, a SIGKILL mid-deletion and the rerun), and recipes/loop.sh
with its defaults over 5 iterations of the tiny model, killed and rerun."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_spade
from tests.test_serve import _free_port, _serve
from tests.test_serve import standin as standin  # noqa: F401 (the fixture)


def _ckpt(run: Path, j: int, updates: int | None = None, published: bool = True) -> Path:
    ck = run / "ckpt" / f"iter_{j:04d}"
    (ck / "trainer_state").mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"w" * 100)
    (ck / "config.json").write_text("{}")
    (ck / "update.json").write_text("{}")
    (ck / "trainer_state" / "optimizer.bin").write_bytes(b"s" * 600)
    (ck / "trainer_state" / "spade_state.json").write_text(json.dumps({"format": 1, "updates": updates or j}))
    if published:
        _manifest(ck)
    return ck


def _manifest(ck: Path, named: str | Path | None = None, stage: str = "update") -> None:
    """The manifest spade update writes beside its checkpoint, in the fields prune reads."""
    Path(f"{ck}.manifest.json").write_text(json.dumps({"stage": stage, "output": {"path": str(named or ck)}}))


def _whole(ck: Path) -> bool:
    return (ck / "model.safetensors").exists()


def _state(ck: Path) -> bool:
    return (ck / "trainer_state" / "optimizer.bin").exists()


@pytest.mark.unit
def test_retention_keeps_the_latest_the_recent_the_eval_points_and_what_pending_stages_read(tmp_path: Path) -> None:
    from stages.prune import prune

    run = tmp_path / "run"
    cks = {j: _ckpt(run, j) for j in range(1, 9)}
    # iteration 7's update wrote ckpt 8; keep 2 back, eval every 3, every 4th state
    dry = prune(run, 7, keep_ckpts=2, keep_state_every=4, eval_every=3, dry_run=True)
    assert dry["status"] == "dry run" and all(_whole(c) and _state(c) for c in cks.values())
    out = prune(run, 7, keep_ckpts=2, keep_state_every=4, eval_every=3)
    assert out == {**dry, "status": "ok", "freed_bytes": out["freed_bytes"]}
    assert [j for j, c in cks.items() if _whole(c)] == [3, 6, 7, 8]  # eval points 3, 6; recent 7, 8
    assert [j for j, c in cks.items() if _state(c)] == [4, 8]  # every 4th, and the latest
    assert out["kept"][str(cks[3])] == "eval point" and out["kept"][str(cks[7])] == "recent"
    assert out["freed_bytes"] == 4 * 100 + 6 * 600
    assert json.loads((cks[1] / "pruned.json").read_text())["pruned"] == ["model.safetensors"]
    assert (cks[1] / "update.json").exists() and Path(f"{cks[1]}.manifest.json").exists()
    meta = json.loads((cks[5] / "trainer_state" / "spade_state.json").read_text())
    assert meta["pruned"] is True and meta["updates"] == 5  # a resume from it names the pruning
    again = prune(run, 7, keep_ckpts=2, keep_state_every=4, eval_every=3)
    assert again["states"] == [] and again["checkpoints"] == [] and again["freed_bytes"] == 0


@pytest.mark.unit
def test_a_checkpoint_an_unfinished_update_reads_is_never_pruned(tmp_path: Path) -> None:
    """Iteration 4's update (ckpt 5) is not published: ckpt 4 (its --model) and ckpt 3 (a pipelined
    loop samples iteration 4 from it) keep weights and state whatever the retention says."""
    from stages.prune import prune

    run = tmp_path / "run"
    cks = {j: _ckpt(run, j) for j in range(1, 5)}
    _ckpt(run, 5, published=False)
    assert prune(run, 4)["status"] == "nothing to do"  # ckpt 5 is not published
    prune(run, 3, keep_ckpts=1)
    assert [j for j, c in cks.items() if _whole(c)] == [3, 4]
    assert [j for j, c in cks.items() if _state(c)] == [4]
    with pytest.raises(Exception, match="keep-ckpts"):
        prune(run, 3, keep_ckpts=0)


def _run(root: Path, last: int, first: int = 1) -> dict[int, Path]:
    return {j: _ckpt(root, j) for j in range(first, last + 1)}


def _weights(cks: dict[int, Path]) -> list[int]:
    return [j for j, c in cks.items() if _whole(c)]


def _shard(ck: Path) -> list[str]:
    """Give ``ck`` the sharded weights a larger save writes, in place of its one file."""
    (ck / "model.safetensors").unlink()
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    for n in names:
        (ck / n).write_bytes(b"w" * 50)
    return names


@pytest.mark.unit
def test_prune_never_deletes_through_a_link_at_any_level(tmp_path: Path) -> None:
    from stages.prune import prune

    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    cks = _run(run, 5)  # iteration 4, one kept back: 1, 2 and 3 may go
    # iter_0002 is a link to a checkpoint outside the run (whose manifest even names the link)
    away = _ckpt(outside, 2)
    shutil.rmtree(cks[2])
    cks[2].symlink_to(away, target_is_directory=True)
    # inside iter_0001: its weight file and a directory of its state are links to the user's files
    user_w, user_state = outside / "base.safetensors", outside / "fsdp_0"
    user_w.write_bytes(b"u" * 10)
    user_state.mkdir()
    (user_state / "shard.bin").write_bytes(b"u")
    (cks[1] / "model.safetensors").unlink()
    (cks[1] / "model.safetensors").symlink_to(user_w)
    (cks[1] / "pytorch_model.bin").write_bytes(b"w" * 100)
    (cks[1] / "trainer_state" / "pytorch_model_fsdp_0").symlink_to(user_state, target_is_directory=True)
    # iter_0003's whole trainer state is a link
    shutil.rmtree(cks[3] / "trainer_state")
    (cks[3] / "trainer_state").symlink_to(away / "trainer_state", target_is_directory=True)

    out = prune(run, 4, keep_ckpts=1)
    assert _whole(away) and _state(away) and (away / "pruned.json").exists() is False
    assert user_w.read_bytes() == b"u" * 10 and (user_state / "shard.bin").exists()
    assert (cks[1] / "model.safetensors").is_symlink() and not (cks[1] / "pytorch_model.bin").exists()
    assert (cks[1] / "trainer_state" / "pytorch_model_fsdp_0").is_symlink() and not _state(cks[1])
    assert not _whole(cks[3]) and _state(away)
    assert out["kept"][str(cks[2])].startswith("a link (to ") and str(cks[2]) not in out["checkpoints"]
    assert out["kept_states"][str(cks[3])].startswith("trainer_state/ a link")
    assert out["checkpoints"] == [str(cks[1]), str(cks[3])]

    # a link as ckpt/ itself: nothing under it is the run's
    run2, store = tmp_path / "run2", tmp_path / "store"
    stored = _run(store, 5)
    run2.mkdir()
    (run2 / "ckpt").symlink_to(store / "ckpt", target_is_directory=True)
    for j in stored:
        _manifest(stored[j], run2 / "ckpt" / f"iter_{j:04d}")
    out = prune(run2, 4, keep_ckpts=1)
    assert _weights(stored) == [1, 2, 3, 4, 5] and all(_state(c) for c in stored.values())
    assert out["checkpoints"] == [] and out["kept"][str(run2 / "ckpt")].startswith("a link (to ")

    # the run directory itself named through a link (the user's name for it) is the run: relative
    # manifests, as the loop's RUN=runs/NAME writes them, name its checkpoints
    real = tmp_path / "runs" / "demo"
    cks = _run(real, 5)
    for j, ck in cks.items():
        _manifest(ck, f"runs/demo/ckpt/iter_{j:04d}")
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    assert prune(tmp_path / "alias", 4, keep_ckpts=1)["checkpoints"] != []
    assert _weights(cks) == [4, 5]


@pytest.mark.unit
def test_prune_deletes_nothing_spade_update_did_not_write(tmp_path: Path) -> None:
    from stages.prune import prune

    run = tmp_path / "runs" / "this"
    cks = _run(run, 7, first=0)  # iteration 6, one kept back: 0-5 may go
    Path(f"{cks[0]}.manifest.json").unlink()  # a base model the user copied in
    _manifest(cks[1], stage="validate")  # another stage's manifest
    other = _ckpt(tmp_path / "runs" / "other", 2)
    _manifest(cks[2], other)  # copied from another run, its manifest with it
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"stage": "update", "output": {"path": str(cks[3])}}))
    Path(f"{cks[3]}.manifest.json").unlink()
    Path(f"{cks[3]}.manifest.json").symlink_to(good)  # a manifest reached through a link
    _manifest(cks[4], "runs/other/ckpt/iter_0004")  # relative, of another run
    Path(f"{cks[5]}.manifest.json").write_text("[]")  # not spade's format
    (run / "ckpt" / "iter_0008").write_text("a file")

    out = prune(run, 6, keep_ckpts=1)
    assert _weights(cks) == list(range(8)) and _whole(other)
    assert [j for j, c in cks.items() if _state(c)] == [0, 1, 2, 3, 4, 5, 7]  # 6 is spade's and superseded
    assert out["checkpoints"] == [] and out["states"] == [str(cks[6])] and out["freed_bytes"] == 600
    kept = {int(k[-4:]): v for k, v in out["kept"].items()}
    assert kept[0] == "no manifest of spade update (iter_0000.manifest.json): spade did not write it"
    assert kept[1] == "iter_0001.manifest.json is not spade update's manifest (stage 'validate')"
    assert kept[2] == f"its manifest was written for another checkpoint ({other})"
    assert kept[3] == "iter_0003.manifest.json is a link, never followed"
    assert kept[4] == "its manifest was written for another checkpoint (runs/other/ckpt/iter_0004)"
    assert kept[5] == "iter_0005.manifest.json is not a JSON object"
    assert kept[6] == "a pending update reads it" and kept[7] == "latest" and kept[8] == "not a directory"

    # with spade's manifests (relative as the loop writes them; absolute from before the run moved) they go
    for j in range(6):
        Path(f"{cks[j]}.manifest.json").unlink(missing_ok=True)
    _manifest(cks[0], "runs/this/ckpt/iter_0000")
    _manifest(cks[1], "/old/disk/this/ckpt/iter_0001")
    for j in range(2, 6):
        _manifest(cks[j])
    prune(run, 6, keep_ckpts=1)
    assert _weights(cks) == [6, 7] and [j for j, c in cks.items() if _state(c)] == [7]
    assert (run / "ckpt" / "iter_0008").read_text() == "a file" and _whole(other)


@pytest.mark.unit
def test_inside_a_checkpoint_only_the_weights_and_the_state_spade_wrote_go(tmp_path: Path) -> None:
    from stages.prune import prune

    run = tmp_path / "run"
    cks = _run(run, 4)  # iteration 3, one kept back: 1 and 2 may go
    shards = _shard(cks[1])
    user = {"notes.txt": b"n", "probe.safetensors": b"p", "analysis/model.safetensors": b"a", ".hidden": b"h"}
    for name, data in user.items():
        (cks[1] / name).parent.mkdir(exist_ok=True)
        (cks[1] / name).write_bytes(data)
    # an unchanged update shares its input's blocks: deleting one name of the file frees nothing
    (cks[2] / "model.safetensors").unlink()
    os.link(cks[3] / "model.safetensors", cks[2] / "model.safetensors")

    out = prune(run, 3, keep_ckpts=1)
    left = sorted(str(p.relative_to(cks[1])) for p in cks[1].rglob("*"))
    assert left == sorted([".hidden", "analysis", "analysis/model.safetensors", "config.json", "notes.txt",
                           "probe.safetensors", "pruned.json", "trainer_state", "trainer_state/spade_state.json",
                           "update.json"])
    assert all((cks[1] / n).read_bytes() == d for n, d in user.items())
    marker = json.loads((cks[1] / "pruned.json").read_text())
    assert marker["state"] == "done" and marker["pruned"] == sorted(shards)
    assert _whole(cks[3]) and (cks[3] / "model.safetensors").stat().st_nlink == 1
    assert out["freed_bytes"] == 3 * 50 + 3 * 600  # the shards and three states; not the shared weights


@pytest.mark.integration
def test_what_a_live_spade_serve_of_the_run_serves_keeps_its_weights(tmp_path: Path, standin: dict,  # noqa: F811
                                                                     ) -> None:
    run = tmp_path / "run"
    cks = _run(run, 5)  # iteration 4, one kept back: 1, 2 and 3 may go
    common = ["--run-dir", run, "--port", str(_free_port()), "--vllm-python", sys.executable]
    up = _serve(*common, "--model", cks[1], env=standin)  # someone evaluates an old checkpoint
    try:
        res = run_spade("prune", run, "-i", "4", "--keep-ckpts", "1")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert _weights(cks) == [1, 4, 5] and str(cks[1]) in out["states"]  # a server reads no trainer state
        why = f"served by the server of {run / 'serve' / 'server.json'} (pid {up['pid']})"
        assert out["kept"][str(cks[1])] == why
        err = " ".join(res.stderr.split())
        assert f"kept {cks[1]}: {why}" in err and "kept 1 latest, 1 a pending update reads it" in err
    finally:
        _serve("--run-dir", run, "--do", "stop", env=standin)
    assert json.loads(run_spade("prune", run, "-i", "4", "--keep-ckpts", "1").stdout)["checkpoints"] == [str(cks[1])]


@pytest.mark.unit
def test_a_server_counts_as_live_only_as_the_process_that_wrote_its_state(tmp_path: Path) -> None:
    from stages.prune import prune
    from stages.serve import _proc_start

    run = tmp_path / "run"
    cks = _run(run, 10)  # iteration 9, one kept back: 1-7 may go
    live = subprocess.Popen(["sleep", "120"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    me = {"pid": live.pid, "host": socket.gethostname(), "proc_start": _proc_start(live.pid)}
    states = {"node-0": {**me, "checkpoint": str(cks[1])},
              "node-1": {**me, "checkpoint": str(cks[1]), "loading": str(cks[2])},  # killed mid-load
              "node-2": {**me, "host": "another-node", "checkpoint": str(cks[3])},  # not checkable from here
              "node-3": {**{k: v for k, v in me.items() if k != "proc_start"}, "checkpoint": str(cks[4])},
              "node-4": {**me, "proc_start": me["proc_start"] + 1, "checkpoint": str(cks[5])},  # a reused pid
              "node-5": {**me, "pid": dead.pid, "checkpoint": str(cks[6])},
              "node-6": {**me, "pid": 0, "checkpoint": str(cks[6])}}  # 0 would name prune's process group
    try:
        for name, state in states.items():
            (run / "serve" / name).mkdir(parents=True)
            (run / "serve" / name / "server.json").write_text(json.dumps(state))
        (run / "serve" / "node-4" / "current").symlink_to(cks[5])
        (run / "serve" / "server.json").write_text("[1, 2]")  # unreadable: what its link serves stays
        (run / "serve" / "current").symlink_to(cks[7])
        out = prune(run, 9, keep_ckpts=1)
    finally:
        live.kill()
        live.wait()
    assert _weights(cks) == [1, 2, 3, 4, 7, 9, 10]
    kept = {int(k[-4:]): v for k, v in out["kept"].items()}
    assert kept[2] == f"served by the server of {run / 'serve' / 'node-1' / 'server.json'} (pid {live.pid})"
    assert "on host another-node (cannot be checked from here)" in kept[3]
    assert "no start time recorded" in kept[4] and "cannot be read" in kept[7]


@pytest.mark.integration
def test_prune_leaves_what_another_stage_writes_and_runs_once_per_run(tmp_path: Path) -> None:
    from tests.test_locks import _holder

    run = tmp_path / "run"
    cks = _run(run, 5)  # iteration 4, one kept back: 1, 2 and 3 may go
    args = ("prune", run, "-i", "4", "--keep-ckpts", "1")
    writer = _holder(cks[2])  # an update rewriting ckpt/iter_0002 (--force) holds its lock
    try:
        res = run_spade(*args)
        assert res.returncode == 0, res.stderr
        why = json.loads(res.stdout)["kept"][str(cks[2])]
        assert why.startswith("locked by another stage: ") and f"pid {writer.pid}" in why
        assert _weights(cks) == [2, 4, 5] and _state(cks[2])
    finally:
        writer.kill()
        writer.wait()
    other = _holder(run / "ckpt")  # another prune of the run
    try:
        res = run_spade(*args)
        assert res.returncode == 1 and res.stdout == "" and f"pid {other.pid}" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1 and _whole(cks[2])
    finally:
        other.kill()
        other.wait()
    res = run_spade(*args)  # the dead prune's lock is taken over
    assert res.returncode == 0 and json.loads(res.stdout)["checkpoints"] == [str(cks[2])]


# an os.unlink that SIGKILLs the process (or fails with an I/O error) just before deleting one
# named entry: a prune killed or failing at an exact point of its deletion, with no hook in spade
KILL_HOOK = """
import errno, os, signal
_unlink = os.unlink
def unlink(path, *args, **kwargs):
    if os.fspath(path) == os.environ.get("PRUNE_KILL_BEFORE"):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.fspath(path) == os.environ.get("PRUNE_FAIL_BEFORE"):
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)
    return _unlink(path, *args, **kwargs)
os.unlink = unlink
"""


def _hooked(tmp_path: Path, **env: str) -> dict:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    return {"PYTHONPATH": os.pathsep.join([str(hook), os.environ["PYTHONPATH"]]), **env}


@pytest.mark.integration
@pytest.mark.parametrize("kill_before", ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                         "optimizer.bin"])
def test_a_prune_killed_mid_deletion_is_finished_by_the_rerun(tmp_path: Path, kill_before: str) -> None:
    from spade_cli.core.artifacts import SpadeError
    from spade_cli.training import trainer_state

    run = tmp_path / "run"
    cks = _run(run, 5)  # iteration 4, one kept back: 1, 2 and 3 may go
    shards = _shard(cks[1])
    args = ("prune", run, "-i", "4", "--keep-ckpts", "1")
    assert run_spade(*args, env=_hooked(tmp_path, PRUNE_KILL_BEFORE=kill_before)).returncode == -signal.SIGKILL
    state = trainer_state.find(str(cks[1]))
    # the state goes first, marked pruned before its files: no update resumes from half a state
    assert state["pruned"] and _state(cks[1]) == (kill_before == "optimizer.bin")
    with pytest.raises(SpadeError, match="was pruned"):
        trainer_state.check_resumable(state, False, 16, 32)
    if kill_before != "optimizer.bin":
        intent = json.loads((cks[1] / "pruned.json").read_text())
        assert intent["state"] == "deleting" and intent["pruned"] == sorted(shards)
        assert (cks[1] / "model-00002-of-00002.safetensors").exists()
    assert _weights(cks) == [2, 3, 4, 5]
    dry = json.loads(run_spade(*args, "--dry-run").stdout)
    assert dry["checkpoints"] == [str(cks[j]) for j in (1, 2, 3)] and (cks[1] / shards[1]).exists()
    res = run_spade(*args)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["checkpoints"] == [str(cks[j]) for j in (1, 2, 3)]
    assert not any((cks[1] / n).exists() for n in shards) and not _state(cks[1])
    assert json.loads((cks[1] / "pruned.json").read_text())["state"] == "done"
    assert _weights(cks) == [4, 5]


@pytest.mark.integration
def test_a_failing_deletion_is_one_line_naming_the_checkpoint_and_the_rerun_finishes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cks = _run(run, 5)
    shards = _shard(cks[2])
    args = ("prune", run, "-i", "4", "--keep-ckpts", "1")
    res = run_spade(*args, env=_hooked(tmp_path, PRUNE_FAIL_BEFORE=shards[1]))
    assert res.returncode == 1 and res.stdout == "" and "Traceback" not in res.stderr
    assert " ".join(res.stderr.split()) == (f"error: {cks[2]}: Input/output error while pruning ({shards[1]}); "
                                            "a rerun finishes what this one began")
    assert json.loads((cks[2] / "pruned.json").read_text())["state"] == "deleting"
    assert json.loads(run_spade(*args).stdout)["checkpoints"] == [str(cks[j]) for j in (2, 3)]
    assert _weights(cks) == [4, 5] and not any((cks[2] / n).exists() for n in shards)


@pytest.mark.unit
def test_a_marker_from_an_earlier_spade_is_finished_and_weights_put_back_after_a_prune_stay(tmp_path: Path) -> None:
    """An earlier spade wrote pruned.json (no state) before deleting: killed between the two, its
    rerun skipped the checkpoint for good. Now the marker reads as an intent."""
    from stages.prune import prune

    run = tmp_path / "run"
    cks = _run(run, 5)
    (cks[1] / "pruned.json").write_text(json.dumps({"pruned": ["model.safetensors"], "why": "retention"}))
    assert prune(run, 4, keep_ckpts=1, dry_run=True)["checkpoints"] == [str(cks[j]) for j in (1, 2, 3)]
    assert _weights(cks) == [1, 2, 3, 4, 5]
    prune(run, 4, keep_ckpts=1)
    assert _weights(cks) == [4, 5] and json.loads((cks[1] / "pruned.json").read_text())["state"] == "done"
    (cks[1] / "model.safetensors").write_bytes(b"restored by the user")
    assert prune(run, 4, keep_ckpts=1)["checkpoints"] == [] and _whole(cks[1])


@pytest.mark.integration
@pytest.mark.slow  # five loop iterations, then a kill and a rerun: CI's second tier
def test_a_five_iteration_loop_ends_with_one_trainer_state_and_the_kept_checkpoints(tiny_model, tmp_path):
    """The loop with its retention defaults (no PRUNE* set) from a checkpoint that carries a trainer
    state (one real update of the tiny model). The tiny model designs nothing valid and earns no
    return, so each iteration's update publishes its input unchanged, state included (hard links):
    every checkpoint holds a trainer state until retention removes all but the latest."""
    from stages import update
    from tests.test_loop import _env, _finish, _log, _loop
    from tests.test_update import _config, make_artifacts

    start = tmp_path / "start"
    update.run(_config(make_artifacts(tmp_path, tiny_model), tiny_model, start))
    env = {**_env(start, {}), "ITERS": "5"}
    cwd = tmp_path / "w"
    proc = _loop(cwd, env)
    ck = cwd / "run" / "ckpt"
    deadline = time.time() + 900
    while time.time() < deadline and proc.poll() is None and not Path(f"{ck}/iter_0004.manifest.json").exists():
        time.sleep(0.05)
    assert proc.poll() is None, _log(cwd)[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)  # right after iteration 3's update: before or during its prune
    proc.wait()
    err = _finish(_loop(cwd, env), cwd)
    assert "iteration 0: done" in err and "iteration 3: done" in err
    whole = sorted(p.name for p in ck.iterdir() if p.is_dir() and (p / "model.safetensors").exists())
    states = sorted(p.name for p in ck.iterdir() if (p / "trainer_state" / "model.safetensors").exists())
    assert whole == ["iter_0004", "iter_0005"] and states == ["iter_0005"], (whole, states)
    assert sorted(p.parent.name for p in ck.glob("iter_*/pruned.json")) == ["iter_0001", "iter_0002", "iter_0003"]
    assert all(json.loads((ck / f"iter_{j:04d}" / "trainer_state" / "spade_state.json").read_text())["pruned"]
               for j in range(1, 5))
    # the report still reads every update; the latest state is whole and the next update resumes it
    assert all((ck / f"iter_{j:04d}" / "update.json").exists() for j in range(1, 6))
    assert (start / "trainer_state" / "optimizer.bin").exists()  # the run's input is never touched
    res = run_spade("prune", cwd / "run", "-i", "4")
    assert res.returncode == 0 and json.loads(res.stdout)["checkpoints"] == []
    from spade_cli.training import trainer_state

    assert not trainer_state.find(str(ck / "iter_0005")).get("pruned")


@pytest.mark.unit
def test_update_keep_state_every_never_deletes_through_a_link(tmp_path):
    """`spade update --keep-state-every` prunes the state of its --model: a state directory that
    is a link, or a link inside it, must not take what it points at with it."""
    from spade_cli.training import trainer_state

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "optimizer.bin").write_bytes(b"x" * 10)
    trainer_state.write_meta(outside, {"updates": 3})
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / trainer_state.STATE_DIR).symlink_to(outside)
    assert not trainer_state.prune(str(linked), 2)
    assert (outside / "optimizer.bin").exists()

    own = tmp_path / "own"
    (own / trainer_state.STATE_DIR).mkdir(parents=True)
    trainer_state.write_meta(own / trainer_state.STATE_DIR, {"updates": 3})
    (own / trainer_state.STATE_DIR / "weights").symlink_to(outside)
    (own / trainer_state.STATE_DIR / "optimizer.bin").write_bytes(b"y")
    assert trainer_state.prune(str(own), 2)
    assert not (own / trainer_state.STATE_DIR / "optimizer.bin").exists()
    assert (outside / "optimizer.bin").exists()  # the link went, its target stayed
