"""`spade inspect` and the ids of failed designs: what a researcher reads each artifact for.

Unit tests feed hand-written rows of every schema to ``spade_cli.summary`` and check figures
computed by hand; integration tests drive the real CLI: a scripted Designer that writes nothing
parseable (the new user's tiny-model run), the bundled pool through `spade validate`, and the
`--row` / `--where` / `--json` views.
"""

from __future__ import annotations

import json

import pytest

from spade_cli import summary
from stages import design
from tests.conftest import run_spade

DESIGNS = [  # two groups of two; three parse failures of two kinds, one parsed design
    {"schema": "spade.design/1", "group_id": "g0", "sample": 0, "doc": {"id": "d0", "source": "s", "text": "t"},
     "completion": "no idea", "code": None, "hint": None, "parse_error": "no fenced python block and no hint section",
     "tokens": {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "logprobs": None}},
    {"schema": "spade.design/1", "group_id": "g0", "sample": 1, "doc": {"id": "d0", "source": "s", "text": "t"},
     "completion": "", "code": None, "hint": None, "parse_error": "empty completion",
     "tokens": {"prompt_ids": [1, 2, 3], "completion_ids": [], "logprobs": None}},
    {"schema": "spade.design/1", "group_id": "g1", "sample": 0, "doc": {"id": "d1", "source": "s", "text": "t"},
     "completion": "", "code": None, "hint": None, "parse_error": "empty completion",
     "tokens": {"prompt_ids": [7], "completion_ids": [], "logprobs": None}},
    {"schema": "spade.design/1", "group_id": "g1", "sample": 1, "doc": {"id": "d1", "source": "s", "text": "t"},
     "completion": "```python\nx = 1\n```\nHint: h", "code": "x = 1\n", "hint": "h", "parse_error": None,
     "tokens": {"prompt_ids": [7], "completion_ids": [8, 9, 10, 11], "logprobs": None}},
]


def _ep(env: str, hinted: bool, ret: float, error: str | None = None, turns: int = 1) -> dict:
    return {"schema": "spade.rollout/1", "episode_id": f"{env}-{hinted}-{ret}", "env_id": env, "iteration": 0,
            "hinted": hinted, "seed": 1, "pair": 0, "return": ret, "error": error,
            "turns": [{"action": "a", "observation": "o", "reward": 0.0}] * turns,
            "tokens": {"prompt_ids": [1, 2], "completion_ids": [3, 4, 5, 6], "env_mask": [1, 1, 0, 1],
                       "logprobs": None}}


ROLLOUTS = [_ep("a", False, 0.0), _ep("a", True, 1.0, turns=3), _ep("b", False, 0.5),
            _ep("b", True, 0.5, error="step_timeout")]
SCORES = [{"schema": "spade.score/1", "env_id": e, "iteration": 0, "signal": "regret", "hinted_mean": h,
           "unhinted_mean": u, "hinted_n": 1, "unhinted_n": 1, "regret": r, "regret_ci95": None,
           "designer_reward": w, "flags": f}
          for e, h, u, r, w, f in (("a", 1.0, 0.0, 1.0, 1.0, []), ("b", 0.5, 0.5, 0.0, -1.0, ["seed_invariant"]),
                                   ("c", 0.6, 0.2, 0.4, 0.4, []))]
MEMORY = [{"schema": "spade.memory/1", "env_id": e, "first_iteration": 0,
           "history": [{"iteration": i, "unhinted_mean": u, "hinted_mean": h, "regret": h - u}
                       for i in range(n)]}
          for e, n, u, h in (("a", 3, 0.1, 0.6), ("b", 1, 0.95, 1.0), ("c", 2, 0.0, 0.0))]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- the failed-design id -----------------------------------------------------------------------

@pytest.mark.unit
def test_failed_designs_get_distinct_deterministic_marked_ids():
    ids = {design.failed_design_id("g0", j, "garbage") for j in range(4)}
    ids.add(design.failed_design_id("g1", 0, "garbage"))
    assert len(ids) == 5 and all(i.startswith(design.FAILED_PREFIX) for i in ids)
    assert design.failed_design_id("g0", 0, "garbage") == design.failed_design_id("g0", 0, "garbage")


# -- summaries of hand-written rows ---------------------------------------------------------------

@pytest.mark.unit
def test_design_summary_counts_failures_by_kind_group_and_document(tmp_path):
    info = summary.summarize([_write(tmp_path / "d.jsonl", DESIGNS)])
    d = info["designs"]
    assert (d["rows"], d["parsed"], d["failed"]) == (4, 1, 3)
    assert d["parse_errors"] == {"empty completion": 2, "no fenced python block and no hint section": 1}
    assert d["by_group"] == {"g0": {"doc_id": "d0", "rows": 2, "failed": 2},
                             "g1": {"doc_id": "d1", "rows": 2, "failed": 1}}
    assert d["by_doc"] == {"d0": {"rows": 2, "failed": 2}, "d1": {"rows": 2, "failed": 1}}
    assert d["completion_tokens"]["max"] == 4 and d["completion_tokens"]["mean"] == 1.5
    assert info["envs"] == 1  # the parsed design; a failure is no environment
    assert info["tokens"] == {"designer": {"prompt": 8, "completion": 6}}


@pytest.mark.unit
def test_rollout_score_and_memory_summaries(tmp_path):
    info = summary.summarize([_write(tmp_path / "r.jsonl", ROLLOUTS), _write(tmp_path / "s.jsonl", SCORES),
                              _write(tmp_path / "m.jsonl", MEMORY)])
    r = info["rollouts"]
    assert r["episodes"] == 4 and r["errors"] == {"step_timeout": 1}
    assert r["hinted"]["mean"] == 0.75 and r["unhinted"]["mean"] == 0.25
    assert r["per_env"]["a"] == {"hinted_mean": 1.0, "unhinted_mean": 0.0, "hinted_n": 1, "unhinted_n": 1,
                                 "gap": 1.0, "errors": 0}
    assert r["per_env"]["b"]["errors"] == 1 and r["turns"]["max"] == 3
    # per episode: 4 completion tokens, 3 of them the agent's (env_mask 1), 1 the environment's
    assert info["tokens"] == {"agent": {"prompt": 8, "completion": 16, "agent": 12, "env": 4}}
    s = info["scores"]
    assert s["flags"] == {"seed_invariant": 1} and s["flagged"] == 1
    assert [t["env_id"] for t in s["top"]] == ["a", "c", "b"]
    assert s["regret"]["median"] == 0.4
    m = info["memory"]
    assert (m["envs"], m["learnable"], m["solved"]) == (3, 1, 1)
    assert m["labels"] == {"learnable": 1, "too easy": 1, "too hard": 1}
    assert m["history_len"]["mean"] == 2.0
    assert info["envs"] == 3


@pytest.mark.unit
def test_where_matches_text_json_and_nested_keys(tmp_path):
    p = _write(tmp_path / "r.jsonl", ROLLOUTS)
    assert summary.summarize([p], summary.parse_where(["hinted=true"]))["rollouts"]["episodes"] == 2
    assert summary.summarize([p], summary.parse_where(["env_id=b", "error=null"]))["rollouts"]["episodes"] == 1
    d = _write(tmp_path / "d.jsonl", DESIGNS)
    assert summary.nth_row([d], 1, summary.parse_where(["doc.id=d1"]))[2]["sample"] == 1
    assert summary.nth_row([d], 0, summary.parse_where(["doc.id=nope"])) is None
    with pytest.raises(ValueError, match="KEY=VALUE"):
        summary.parse_where(["reason"])


# -- the real CLI ---------------------------------------------------------------------------------

@pytest.mark.integration
def test_a_designer_that_writes_nothing_parseable(tmp_path):
    """The new user's first run: every design fails; ids stay distinct through validate and regret."""
    outs = tmp_path / "outs.json"
    outs.write_text(json.dumps(["no idea", "", "```python\nclass E: pass\n```", "Hint: press it"]))
    env = {"SPADE_FAKE_OUTPUTS": str(outs)}
    d = tmp_path / "designs.jsonl"
    args = ["design", "--backend", "fake", "--model", "scripted", "--n", "8", "--group", "4", "--out", d]
    res = run_spade(*args, env=env)
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in d.read_text().splitlines()]
    ids = [r["env_id"] for r in rows]
    assert len(set(ids)) == 8 and all(i.startswith("unparsed-") for i in ids)
    assert run_spade(*args, "--force", env=env).returncode == 0  # deterministic: a rerun writes the same ids
    assert [json.loads(line)["env_id"] for line in d.read_text().splitlines()] == ids

    res = run_spade("inspect", d, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["envs"] == 0 and info["designs"]["failed"] == 8
    assert info["designs"]["parse_errors"] == {"no fenced python block and no hint section": 2,
                                               "empty completion": 2, "no hint section": 2,
                                               "no fenced python block": 2}
    assert sorted(g["failed"] for g in info["designs"]["by_group"].values()) == [4, 4]
    assert sum(v["failed"] for v in info["designs"]["by_doc"].values()) == 8
    human = run_spade("inspect", d, env={"COLUMNS": "120"}).stderr
    assert "parse errors by kind" in human and "designer" in human and "per grounding document" in human

    v, s, empty = tmp_path / "validated.jsonl", tmp_path / "scores.jsonl", tmp_path / "rollouts.jsonl"
    assert run_spade("validate", "--designs", d, "--out", v, "--workers", "1").returncode == 0
    vrows = [json.loads(line) for line in v.read_text().splitlines()]
    assert [r["reason"] for r in vrows] == ["no_code"] * 8 and [r["env_id"] for r in vrows] == ids
    empty.write_text("")
    res = run_spade("regret", "--envs", v, "--rollouts", empty, "--out", s)
    assert res.returncode == 0, res.stderr
    srows = [json.loads(line) for line in s.read_text().splitlines()]
    assert [(r["env_id"], r["group_id"], r["sample"]) for r in srows] == \
        [(r["env_id"], r["group_id"], r["sample"]) for r in rows]
    info = json.loads(run_spade("inspect", v, "--json").stdout)["validation"]
    assert info["reasons"] == {"no_code": 8} and info["failed_checks"] == {"code": 8}
    assert sum(info["parse_errors"].values()) == 8


@pytest.mark.integration
def test_pool_designs_validate_and_inspect_with_row_and_where(tmp_path):
    d, v = tmp_path / "designs.jsonl", tmp_path / "validated.jsonl"
    assert run_spade("design", "--pool", "bundled", "--n", "3", "--out", d).returncode == 0
    res = run_spade("validate", "--designs", d, "--out", v, "--workers", "1")
    assert res.returncode == 0, res.stderr
    info = json.loads(run_spade("inspect", v, "--json").stdout)
    val = info["validation"]
    assert (val["rows"], val["valid"], val["valid_rate"]) == (3, 3, 1.0) and info["envs"] == 3
    assert val["step_ms_p50"]["n"] == 3 and val["step_ms_p50"]["median"] > 0
    res = run_spade("inspect", v, "--where", "valid=true", "--row", "2", "--json")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert shown["file"] == str(v) and shown["line"] == 3 and shown["row"]["valid"] is True
    res = run_spade("inspect", v, "--where", "reason=trivial", "--row", "0")
    assert res.returncode == 1 and "no row 0 matching reason=trivial" in res.stderr
    res = run_spade("inspect", v, "--where", "reason")
    assert res.returncode == 2 and "KEY=VALUE" in res.stderr
    res = run_spade("inspect", v, "--where", "reason=trivial", "--json")
    assert json.loads(res.stdout)["rows"] == 0


@pytest.mark.integration
def test_every_schema_in_one_inspect(tmp_path):
    files = [_write(tmp_path / "d.jsonl", DESIGNS), _write(tmp_path / "r.jsonl", ROLLOUTS),
             _write(tmp_path / "s.jsonl", SCORES), _write(tmp_path / "m.jsonl", MEMORY)]
    res = run_spade("inspect", *files, "--json")
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert set(info) >= {"files", "rows", "schemas", "envs", "designs", "rollouts", "scores", "memory", "tokens"}
    assert info["rows"] == 14 and set(info["tokens"]) == {"designer", "agent"}
    human = run_spade("inspect", *files, env={"COLUMNS": "100"}).stderr
    for title in ("returns per env", "top environments by designer reward", "audit flags", "learnable",
                  "tokens by role"):
        assert title in human, title
