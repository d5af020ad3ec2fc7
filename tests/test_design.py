"""`spade design` end to end: the real CLI, the tiny model through the hf and openai backends,
up-to-date skips and refusals, a kill -9 in the middle of a run, pools from files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from spade_cli.designer.corpus import BUNDLED
from stages import design
from tests.conftest import run_spade
from tests.test_backend_openai import serve  # noqa: F401  (the transformers serve fixture)

SAMPLE = BUNDLED / "sample.jsonl"


def write_memory(path: Path) -> Path:
    rows = [
        {"schema": "spade.memory/1", "env_id": "m1", "title": "Compound interest quiz", "hint": "Use the rule of 72.",
         "doc_id": "banking/interest", "first_iteration": 0,
         "history": [{"iteration": 0, "unhinted_mean": 0.9, "hinted_mean": 1.0, "regret": 0.1}]},
        {"schema": "spade.memory/1", "env_id": "m2", "title": "Hump yard sorting", "hint": "Sort by block.",
         "doc_id": "logistics/rail-freight", "first_iteration": 1,
         "history": [{"iteration": 1, "unhinted_mean": 0.1, "hinted_mean": 0.6, "regret": 0.5}]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_rows(rows: list[dict], n: int, group: int, backend: str) -> None:
    assert len(rows) == n
    groups = Counter(r["group_id"] for r in rows)
    assert len(groups) == n // group and set(groups.values()) == {group}
    for r in rows:
        assert r["schema"] == "spade.design/1"
        assert sorted(x["sample"] for x in rows if x["group_id"] == r["group_id"]) == list(range(group))
        assert r["doc"]["id"] and r["doc"]["text"] in r["messages"][1]["content"]
        assert r["tokens"]["prompt_ids"] and isinstance(r["completion"], str)
        lp = r["tokens"]["logprobs"]
        assert lp is None or len(lp) == len(r["tokens"]["completion_ids"])
        assert r["gen"]["backend"] == backend and {"model", "temperature", "seed"} <= set(r["gen"])
        # a random model writes garbage: the row is kept, with the reason, and code/hint null
        if r["parse_error"]:
            assert r["code"] is None and r["hint"] is None


@pytest.mark.integration
def test_acceptance_24_designs_6_groups_one_call(tiny_model, tmp_path):
    out, memory = tmp_path / "d.jsonl", write_memory(tmp_path / "memory.jsonl")
    args = ["design", "--n", "24", "--group", "4", "--model", tiny_model, "--corpus", SAMPLE,
            "--memory", memory, "--max-tokens", "12", "--seed", "5", "--out", out]
    res = run_spade(*args)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["rows"], summary["groups"], summary["backend_calls"]) == (24, 6, 1)
    rows = rows_of(out)
    check_rows(rows, 24, 4, "hf")
    assert summary["parse_errors"] == sum(r["parse_error"] is not None for r in rows)
    assert all("[learnable] Hump yard sorting" in r["messages"][1]["content"] for r in rows)
    # the same seed gives the same documents and prompts as the core computes in-process
    plan = design.plan_prompts(24, 4, seed=5, iteration=0, corpus=str(SAMPLE), grounding=True,
                               memory=memory, excerpt_chars=1500)
    first = {r["group_id"]: r for r in rows if r["sample"] == 0}
    assert [(p["doc"], p["messages"]) for p in plan] == [(first[p["group_id"]]["doc"],
                                                          first[p["group_id"]]["messages"]) for p in plan]
    other = design.plan_prompts(24, 4, seed=6, iteration=0, corpus=str(SAMPLE), grounding=True,
                                memory=memory, excerpt_chars=1500)
    assert [p["doc"]["id"] for p in other] != summary["doc_ids"]
    # rerun: up to date; another config without --force: refused with a reason
    again = run_spade(*args)
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "up to date"
    refused = run_spade(*args[:-4], "--seed", "6", "--out", out)
    assert refused.returncode == 1 and "seed 5 -> 6" in refused.stderr and "--force" in refused.stderr


@pytest.mark.integration
def test_ablations_reach_the_prompt(tiny_model, tmp_path):
    out = tmp_path / "d.jsonl"
    res = run_spade("design", "--n", "2", "--group", "2", "--model", tiny_model, "--no-grounding",
                    "--max-tokens", "4", "--out", out)  # the memory ablation: no --memory
    assert res.returncode == 0, res.stderr
    for r in rows_of(out):
        assert r["doc"] is None
        user = r["messages"][1]["content"]
        assert "<document>" not in user and "Environment memory" not in user and "Hump yard" not in user
    assert json.loads(res.stdout)["memory"] is None


@pytest.mark.integration
def test_usage_and_input_errors(tiny_model, tmp_path):
    res = run_spade("design", "--n", "10", "--group", "4", "--model", tiny_model, "--out", tmp_path / "x.jsonl")
    assert res.returncode == 2 and "multiple of --group" in res.stderr
    res = run_spade("design", "--n", "4", "--out", tmp_path / "x.jsonl")
    assert res.returncode == 2 and "--pool" in res.stderr
    bad = tmp_path / "memory.jsonl"
    bad.write_text('{"schema": "spade.memory/1", "env_id": "a"}\n{"schema": "spade.memory/1"}\n')
    res = run_spade("design", "--n", "4", "--model", tiny_model, "--memory", bad, "--out", tmp_path / "x.jsonl")
    assert res.returncode == 1 and f"{bad}:2" in res.stderr and "env_id" in res.stderr
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.integration
def test_kill_9_then_resume_redoes_only_missing_groups(tiny_model, tmp_path):
    out = tmp_path / "d.jsonl"
    args = ["design", "--n", "8", "--group", "4", "--chunk", "1", "--model", str(tiny_model),
            "--max-tokens", "8", "--excerpt-chars", "200", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "spade_cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=os.environ.copy())
    deadline = time.monotonic() + 300
    partial = None
    while time.monotonic() < deadline and proc.poll() is None:
        partial = next(iter(tmp_path.glob("d.jsonl.partial-*")), None)
        if partial and partial.read_text().count("\n") >= 4:
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.skip("the run finished before it could be killed")  # a very fast machine
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    res = run_spade(*args)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["resumed_rows"] == 4 and summary["backend_calls"] == 1 and summary["rows"] == 8
    check_rows(rows_of(out), 8, 4, "hf")


@pytest.mark.integration
def test_pool_from_a_designs_file(tmp_path):
    full = tmp_path / "pool.jsonl"
    assert run_spade("design", "--pool", "bundled", "--n", "100", "--out", full).returncode == 0
    sub = tmp_path / "sub.jsonl"
    res = run_spade("design", "--pool", full, "--n", "5", "--seed", "2", "--iteration", "3", "--out", sub)
    assert res.returncode == 0, res.stderr
    rows = rows_of(sub)
    assert len(rows) == 5 and len({r["env_id"] for r in rows}) == 5
    assert {r["env_id"] for r in rows} <= {r["env_id"] for r in rows_of(full)}
    assert all(r["iteration"] == 3 and r["gen"]["backend"] == "pool" for r in rows)


@pytest.mark.integration
def test_openai_backend_against_transformers_serve(serve, tiny_model, tmp_path):  # noqa: F811
    out, memory = tmp_path / "d.jsonl", write_memory(tmp_path / "memory.jsonl")
    res = run_spade("design", "--n", "8", "--group", "4", "--model", tiny_model, "--backend", "openai",
                    "--base-url", serve, "--memory", memory, "--max-tokens", "8", "--excerpt-chars", "300",
                    "--out", out)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["rows"], summary["groups"], summary["backend_calls"]) == (8, 2, 1)
    check_rows(rows_of(out), 8, 4, "openai")
