"""`spade rollout` end to end: the real CLI, the real sandbox, the real tiny model through hf."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spade_cli.core.records import env_id_for
from stages.rollout import in_shard, load_envs, parse_shard
from tests.conftest import run_spade
from tests.test_rollout_envs import CRASHER, GUESS, HINT, RAISER, validation_row, write_envs

FAST = ["--max-turns", "3", "--max-tokens", "8", "--max-episode-tokens", "1024"]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.integration
def test_rollout_cli_pairs_episodes_survives_a_crash_and_is_up_to_date(tiny_model, tmp_path):
    envs = tmp_path / "validated.jsonl"
    crasher = CRASHER.replace("CRASH", "import os; os._exit(3)")
    write_envs(envs, [validation_row(GUESS), validation_row(crasher), validation_row(RAISER, valid=False)])
    out = tmp_path / "rollouts.jsonl"
    args = ["rollout", "--model", tiny_model, "--envs", envs, "--k", "2", "--out", out, *FAST,
            "--quarantine-after", "10"]
    res = run_spade(*args)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["episodes"] == 8 and summary["envs"] == 2
    assert "rollout: 8/8 episodes" in res.stderr  # no TTY: log lines, not a bar
    assert summary["skipped"]["invalid"] == 1 and summary["sandbox_tier"] in ("process", "strong")
    rows = _rows(out)
    assert len({r["episode_id"] for r in rows}) == 8
    for r in rows:
        assert r["schema"] == "spade.rollout/1" and "return" in r and r["iteration"] == 0
        assert (HINT in json.dumps(r["messages"])) is r["hinted"]
    crashed = [r for r in rows if r["env_id"] == env_id_for(crasher, HINT)]
    # the second step kills the env process: every episode ends there, the stage goes on
    assert all(r["error"] in ("crashed", "exited_early") and len(r["turns"]) == 1 and r["return"] == 0.0
               for r in crashed)
    good = [r for r in rows if r["env_id"] == env_id_for(GUESS, HINT)]
    assert all(r["error"] is None for r in good)
    seeds = {}
    for r in good:
        seeds.setdefault(r["pair"], set()).add(r["seed"])
    assert all(len(s) == 1 for s in seeds.values()) and len(seeds) == 2
    manifest = json.loads((tmp_path / "rollouts.jsonl.manifest.json").read_text())
    assert manifest["output"]["rows"] == 8 and manifest["sandbox"]["tier"] == summary["sandbox_tier"]

    again = run_spade(*args)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "up to date"
    changed = run_spade(*args[:-2], "--quarantine-after", "3")
    assert changed.returncode == 1 and "--force" in changed.stderr


@pytest.mark.integration
def test_rollout_resumes_after_kill_9_without_duplicates(tiny_model, tmp_path):
    envs = tmp_path / "validated.jsonl"
    write_envs(envs, [validation_row(GUESS), validation_row(GUESS.replace("0 to 9", "zero to nine"))])
    out = tmp_path / "rollouts.jsonl"
    args = ["rollout", "--model", tiny_model, "--envs", envs, "--k", "3", "--out", out, *FAST,
            "--max-concurrent", "4"]
    proc = subprocess.Popen([sys.executable, "-m", "spade_cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    partial = None
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        parts = list(tmp_path.glob("rollouts.jsonl.partial-*"))
        if parts and len(parts[0].read_bytes().splitlines()) >= 2:
            partial = parts[0]
            break
        time.sleep(0.05)
    assert partial is not None and proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {json.loads(line)["episode_id"] for line in partial.read_bytes().splitlines()
              if line.endswith(b"}")}
    assert 1 <= len(before) < 12 and not out.exists()

    res = run_spade(*args)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    rows = _rows(out)
    ids = [r["episode_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 12
    assert before <= set(ids) and summary["resumed"] >= len(before) - 1  # a torn last line is replayed
    assert summary["played"] + summary["resumed"] == 12

    # Replies are seeded per episode and turn, not per batch: the killed-and-resumed run holds the
    # very episodes an uninterrupted run plays.
    clean = tmp_path / "clean.jsonl"
    res = run_spade(*args[:args.index("--out")], "--out", clean, *args[args.index("--out") + 2:])
    assert res.returncode == 0, res.stderr
    resumed = {r["episode_id"]: r for r in rows}
    for r in _rows(clean):
        got, want = resumed[r["episode_id"]], r
        assert (got["turns"], got["return"]) == (want["turns"], want["return"])
        for key in ("prompt_ids", "completion_ids", "env_mask"):
            assert got["tokens"][key] == want["tokens"][key]
        # log-probs come from batches padded differently: equal up to float noise
        for a, b in zip(got["tokens"]["logprobs"], want["tokens"]["logprobs"], strict=True):
            assert (a is None and b is None) or abs(a - b) < 1e-4


@pytest.mark.integration
def test_bad_rows_and_bad_flags(tiny_model, tmp_path):
    envs = tmp_path / "validated.jsonl"
    envs.write_text(json.dumps(validation_row(GUESS)) + "\n{not json\n")
    res = run_spade("rollout", "--model", tiny_model, "--envs", envs, "--out", tmp_path / "o.jsonl")
    assert res.returncode == 1 and f"{envs}:2" in res.stderr
    res = run_spade("rollout", "--model", tiny_model, "--envs", envs, "--out", tmp_path / "o.jsonl",
                    "--shard", "4/2")
    assert res.returncode == 2 and "--shard" in res.stderr


@pytest.mark.unit
def test_shards_split_envs_disjointly_and_completely(tmp_path):
    envs = tmp_path / "validated.jsonl"
    codes = [GUESS.replace("0 to 9", f"0 to 9 #{i}") for i in range(12)]
    write_envs(envs, [validation_row(c) for c in codes] + [validation_row(codes[0])])
    assert parse_shard("1/3") == (1, 3) and parse_shard(None) == (0, 1)
    seen = []
    for i in range(3):
        got, counts = load_envs([envs], (i, 3))
        assert all(in_shard(e, (i, 3)) for e in got)
        seen += list(got)
    assert sorted(seen) == sorted({env_id_for(c, HINT) for c in codes})
    assert load_envs([envs], (0, 1))[1]["duplicate"] == 1
