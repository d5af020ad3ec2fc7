"""`spade report` over a hand-made run directory whose figures are computed by hand below.

The run has three iterations: iteration 0 is complete (designs, validation, two rollout shards,
scores with a manifest, the update that followed it, an eval), iteration 1 stopped after
validation with a half-written rollout partial (it must be ignored), and the final checkpoint
(iteration 2) has only an eval.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_spade

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _design(i: int, k: int, parse_error: str | None = None) -> dict:
    return {"schema": "spade.design/1", "iteration": i, "code": None if parse_error else f"# env {i}.{k}",
            "hint": f"hint {k}", "parse_error": parse_error}


def _val(i: int, k: int, valid: bool, reason: str | None = None) -> dict:
    return {**_design(i, k), "schema": "spade.validation/1", "valid": valid, "reason": reason}


def _ep(env: str, hinted: bool, pair: int, ret: float, error: str | None = None) -> dict:
    return {"schema": "spade.rollout/1", "episode_id": f"{env}-{int(hinted)}-{pair}", "env_id": env,
            "iteration": 0, "hinted": hinted, "seed": pair, "pair": pair, "return": ret, "error": error}


def _score(env: str, regret: float | None, reward: float) -> dict:
    return {"schema": "spade.score/1", "env_id": env, "iteration": 0, "signal": "regret", "hinted_mean": None,
            "unhinted_mean": None, "hinted_n": 2, "unhinted_n": 2, "regret": regret, "regret_ci95": None,
            "designer_reward": reward}


def _eval(task: str, value: float) -> dict:
    return {"schema": "spade.eval/1", "task": task, "metric": "score", "value": value, "stderr": 0.1, "n": 10}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    root = tmp_path / "runs" / "demo"
    it0, it1 = root / "iter_0000", root / "iter_0001"
    _jsonl(it0 / "designs.jsonl", [_design(0, 0), _design(0, 1), _design(0, 2), _design(0, 3, "no code block")])
    _jsonl(it0 / "validated.jsonl", [_val(0, 0, True), _val(0, 1, True), _val(0, 2, False, "trivial"),
                                     _val(0, 3, False, "no_code")])
    # Two shards: unhinted returns 0, 0.5, 0.25, 0.25 (mean 0.25); hinted 1, 0.5, 1, 0.5 (mean 0.75).
    _jsonl(it0 / "rollouts.shard-00-of-02.jsonl", [_ep("a", False, 0, 0.0), _ep("a", False, 1, 0.5),
                                                   _ep("a", True, 0, 1.0), _ep("a", True, 1, 0.5)])
    _jsonl(it0 / "rollouts.shard-01-of-02.jsonl", [_ep("b", False, 0, 0.25), _ep("b", False, 1, 0.25),
                                                   _ep("b", True, 0, 1.0), _ep("b", True, 1, 0.5, "step_timeout")])
    # Regrets 0.5 and 0.5 -> mean 0.5; rewards 0.5, 0.5, 0 -> mean 1/3; a null regret is left out.
    _jsonl(it0 / "scores.jsonl", [_score("a", 0.5, 0.5), {**_score("b", 0.5, 0.5), "flags": ["seed_invariant"]},
                                  _score("c", None, 0.0)])
    (it0 / "scores.jsonl.manifest.json").write_text(json.dumps(
        {"stage": "regret", "summary": {"vendi": 1.5, "vendi_per_n": 0.75}}))
    upd = root / "ckpt" / "iter_0001" / "update.json"
    upd.parent.mkdir(parents=True)
    upd.write_text(json.dumps({"metrics": {"loss": 0.125, "kl": None, "entropy": 2.0,
                                           "clip_ratio": {"low": 0.0, "high": 0.01, "region": 0.01},
                                           "grad_norm": {"mean": 0.5, "max": 0.75}},
                               "roles": {"agent": {"advantage": {"n": 8, "mean": 0.0, "std": 1.0}}}}))
    _jsonl(root / "eval" / "iter_0000.jsonl", [_eval("rg:basic_arithmetic", 0.2)])
    _jsonl(it1 / "validated.jsonl", [_val(1, 0, True), _val(1, 1, False, "trivial")])
    (it1 / "rollouts.jsonl.partial-0123456789ab").write_text(json.dumps(_ep("z", False, 0, 1.0)) + "\n{tor")
    _jsonl(root / "eval" / "iter_0002.jsonl", [_eval("rg:basic_arithmetic", 0.4)])
    return root


def _csv(root: Path) -> list[dict]:
    with open(root / "report" / "iterations.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.integration
def test_report_tables_and_plots_hold_hand_computed_values(run_dir: Path) -> None:
    proc = run_spade("report", run_dir, env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(proc.stdout.strip().splitlines()) == 1
    assert (summary["iterations"], summary["first"], summary["last"]) == (3, 0, 2)

    rows = _csv(run_dir)
    assert [r["iteration"] for r in rows] == ["0", "1", "2"]
    r0, r1, r2 = rows
    assert (r0["designs"], r0["parse_errors"], r0["validated"], r0["valid"]) == ("4", "1", "4", "2")
    assert float(r0["valid_rate"]) == 0.5
    assert r0["invalid_reasons"] in ("trivial:1;no_code:1", "no_code:1;trivial:1")
    assert r0["episodes"] == "8" and r0["flagged"] == "seed_invariant:1"
    assert r0["agent_tokens"] == ""  # episodes without token ids: the Agent's token count is unknown
    top = list(csv.DictReader((run_dir / "report" / "top_regret.csv").open()))
    assert [(t["iteration"], t["env_id"], t["flags"]) for t in top] == [("0", "a", ""), ("0", "b", "seed_invariant")]
    assert float(r0["unhinted_mean"]) == pytest.approx(0.25)
    assert float(r0["hinted_mean"]) == pytest.approx(0.75)
    assert r0["episode_errors"] == "step_timeout:1"
    assert float(r0["regret_mean"]) == pytest.approx(0.5)
    assert float(r0["designer_reward_mean"]) == pytest.approx(1 / 3)
    assert (float(r0["vendi"]), float(r0["vendi_per_n"])) == (1.5, 0.75)
    assert float(r0["update.loss"]) == 0.125 and float(r0["update.grad_norm.mean"]) == 0.5
    assert float(r0["update.roles.agent.advantage.std"]) == 1.0
    assert "update.kl" not in r0  # a null KL (beta 0) gives no column
    assert float(r0["eval:rg:basic_arithmetic/score"]) == pytest.approx(0.2)
    # Iteration 1 stopped after validation: its rollout partial is not read.
    assert (r1["valid"], float(r1["valid_rate"]), r1["episodes"], r1["unhinted_mean"]) == ("1", 0.5, "", "")
    # The final checkpoint has only its eval.
    assert r2["designs"] == "" and float(r2["eval:rg:basic_arithmetic/score"]) == pytest.approx(0.4)

    lines = (run_dir / "report" / "iterations.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["invalid_reasons"] == {"trivial": 1, "no_code": 1}

    names = {Path(p).name for p in summary["plots"]}
    assert names == {"returns.png", "validity.png", "diversity.png", "update.png", "eval.png", "labels.png",
                     "regret.png"}
    for name in names:
        data = (run_dir / "report" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    assert "valid%" in proc.stderr and "Vendi/n" in proc.stderr


@pytest.mark.unit
def test_report_cache_follows_changed_inputs(run_dir: Path) -> None:
    from stages import report

    first = report.run(run_dir, plots=False)["rows"][0]
    assert first["unhinted_mean"] == pytest.approx(0.25)
    shard = run_dir / "iter_0000" / "rollouts.shard-00-of-02.jsonl"
    _jsonl(shard, [_ep("a", False, 0, 1.0), _ep("a", False, 1, 1.0), _ep("a", True, 0, 1.0)])
    again = report.run(run_dir, plots=False)["rows"][0]
    assert again["unhinted_mean"] == pytest.approx((1.0 + 1.0 + 0.25 + 0.25) / 4)
    assert again["episodes"] == 7


@pytest.mark.integration
def test_report_names_a_bad_row_and_rejects_an_empty_dir(run_dir: Path, tmp_path: Path) -> None:
    bad = run_dir / "iter_0000" / "scores.jsonl"
    bad.write_text(bad.read_text() + '{"schema": "spade.score/1", "env_id": "x"}\n')
    proc = run_spade("report", run_dir)
    assert proc.returncode == 1
    assert f"{bad}:4" in proc.stderr.replace("\n", "")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_spade("report", empty)
    assert proc.returncode == 1 and "run directory" in proc.stderr


def test_engine_columns_count_every_server_of_a_fleet(tmp_path: Path) -> None:
    """Starts and loads are counted over the run's one server and each server of a fleet
    (RUN/serve/NAME/events.jsonl); the seconds are the slowest server's, since they load side by side."""
    from spade_cli.core.layout import RunLayout
    from stages.report import engine_events

    def events(path: Path, rows: list[dict]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "lo')  # + a line cut by a kill

    events(tmp_path / "serve" / "node-0" / "events.jsonl",
           [{"event": "start", "iteration": 0, "seconds": 60.0}, {"event": "load", "iteration": 1, "seconds": 2.0}])
    events(tmp_path / "serve" / "node-1" / "events.jsonl",
           [{"event": "start", "iteration": 0, "seconds": 70.0}, {"event": "load", "iteration": 1, "seconds": 3.5},
            {"event": "restart", "iteration": 1, "seconds": 50.0}, {"event": "sleep", "iteration": 1}])
    got = engine_events(RunLayout(tmp_path))
    assert got == {0: {"engine_starts": 2, "engine_start_s": 70.0, "engine_loads": 0, "engine_load_s": 0.0},
                   1: {"engine_starts": 1, "engine_start_s": 50.0, "engine_loads": 2, "engine_load_s": 3.5}}


def _spec_val(i: int, env: str, level: int | None, valid: bool = True) -> dict:
    return {"schema": "spade.validation/1", "env_id": env, "iteration": i, "code": f"# {env}", "hint": "h",
            "valid": valid, "reason": None if valid else "trivial",
            **({"spec": {"rule": "reverse", "level": level}} if level is not None else {})}


def _scored(env: str, unhinted: float | None, hinted: float | None, ci: float | None, valid: bool = True) -> dict:
    regret = None if unhinted is None or hinted is None else hinted - unhinted
    return {**_score(env, regret, regret if valid else -1.0), "unhinted_mean": unhinted, "hinted_mean": hinted,
            "regret_ci95": ci, "valid": valid}


@pytest.fixture
def spec_run(tmp_path: Path) -> Path:
    """Iteration 0 plays five valid spec designs, one invalid, and a fixed set outside the run (x1,
    level 2) that only its rollout manifest names; iteration 1 plays one design and the replay of e1
    (its level from iter_0000/replay.jsonl, no rollout manifest); iteration 2's designs carry no spec."""
    root = tmp_path / "runs" / "spec"
    it0, it1, it2 = (root / f"iter_{i:04d}" for i in range(3))
    _jsonl(it0 / "validated.jsonl", [_spec_val(0, "e1", 1), _spec_val(0, "e2", 2), _spec_val(0, "e3", 3),
                                     _spec_val(0, "e5", 1), _spec_val(0, "e6", 3), _spec_val(0, "e4", 3, False)])
    extras = tmp_path / "extras.jsonl"
    _jsonl(extras, [_spec_val(0, "x1", 2)])
    unhinted = {"e1": (1.0, 0.5), "e2": (0.5, 0.5), "e3": (0.0, 0.5), "e5": (1.0, 0.8), "e6": (0.0, 0.0),
                "x1": (0.0, 0.0)}
    _jsonl(it0 / "rollouts.jsonl", [_ep(e, h, p, 1.0 if h else u[p]) for e, u in unhinted.items()
                                    for h in (False, True) for p in (0, 1)])
    (it0 / "rollouts.jsonl.manifest.json").write_text(json.dumps(
        {"stage": "rollout", "inputs": {"envs": [{"path": str(it0 / "validated.jsonl")}, {"path": str(extras)}]}}))
    # labels: e1 learnable, e2 no signal, e3 too hard (hinted 0.1), e5 too easy, e6 learnable (CI 0.6 > regret)
    _jsonl(it0 / "scores.jsonl", [_scored("e1", 0.75, 1.0, 0.1), _scored("e2", 0.5, 0.6, 0.3),
                                  _scored("e3", 0.25, 0.1, 0.05), _scored("e5", 0.9, 0.9, None),
                                  _scored("e6", 0.0, 0.5, 0.6), _scored("e4", None, None, None, valid=False)])
    _jsonl(it0 / "replay.jsonl", [{**_spec_val(1, "e1", 1), "replay": {"priority": 1.0}}])
    _jsonl(it1 / "validated.jsonl", [_spec_val(1, "e7", 2)])
    _jsonl(it1 / "rollouts.jsonl", [_ep(e, False, p, r) for e, r in (("e7", 0.5), ("e1", 1.0)) for p in (0, 1)])
    _jsonl(it1 / "scores.jsonl", [_scored("e7", 0.5, 1.0, 0.4)])
    _jsonl(it2 / "validated.jsonl", [_spec_val(2, "e8", None)])
    _jsonl(it2 / "rollouts.jsonl", [_ep("e8", False, 0, 1.0)])
    return root


@pytest.mark.integration
def test_curriculum_diagnostics_hold_hand_computed_values(spec_run: Path) -> None:
    proc = run_spade("report", spec_run, env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in (spec_run / "report" / "iterations.jsonl").read_text().splitlines()]
    r0, r1, r2 = rows
    # five valid designs: 1 too easy, 2 learnable, 1 too hard, 1 no signal (the invalid one is left out)
    assert [r0[f"share_{k}"] for k in ("too_easy", "learnable", "too_hard", "no_signal", "untested")] == \
        pytest.approx([0.2, 0.4, 0.2, 0.2, 0.0])
    # regrets -0.15, 0, 0.1, 0.25, 0.5: p10 at rank 0.4, p90 at rank 3.6 (linear interpolation)
    assert [r0[f"regret_p{q}"] for q in (10, 25, 50, 75, 90)] == pytest.approx([-0.09, 0.0, 0.1, 0.25, 0.4])
    assert r0["share_ci_above_0"] == pytest.approx(0.2)  # e1 only: 0.25 - 0.1 > 0; e5 has no interval
    assert r0["levels"] == {"1": 2, "2": 1, "3": 2} and r0["level_mean"] == pytest.approx(2.0)
    # level 1: e1 + e5 = (1 + 0.5 + 1 + 0.8) / 4; level 2: e2 + the fixed set's x1; level 3: e3 + e6
    assert r0["unhinted_by_level"] == pytest.approx({"1": 0.825, "2": 0.25, "3": 0.125})
    assert r0["frontier"] == 1
    # iteration 1: the replayed e1 (level 1) is solved, the new e7 (level 2) just reaches 0.5
    assert r1["unhinted_by_level"] == pytest.approx({"1": 1.0, "2": 0.5}) and r1["frontier"] == 2
    assert r1["levels"] == {"2": 1} and r1["share_learnable"] == 1.0 and r1["share_ci_above_0"] == 1.0
    # iteration 2: no spec, no level figures
    assert not {"levels", "level_mean", "unhinted_by_level", "frontier"} & r2.keys()
    cells = _csv(spec_run)[0]
    assert cells["levels"] == "1:2;2:1;3:2" and cells["frontier"] == "1" and cells["share_learnable"] == "0.4"
    assert _csv(spec_run)[1]["share_no_signal"] == "0.0"
    for name in ("labels.png", "regret.png", "frontier.png"):
        data = (spec_run / "report" / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000


@pytest.mark.unit
def test_without_specs_no_level_figures_and_no_frontier_plot(run_dir: Path) -> None:
    from stages import report

    result = report.run(run_dir)
    assert not {"levels", "level_mean", "unhinted_by_level", "frontier"} & set(result["columns"])
    assert {Path(p).name for p in result["plots"]} >= {"labels.png", "regret.png"}
    assert not (run_dir / "report" / "frontier.png").exists()
    # the fixture's scores carry no means: every design is untested, its regret still counts
    assert result["rows"][0]["share_untested"] == 1.0 and result["rows"][0]["regret_p50"] == 0.5


@pytest.mark.integration
@pytest.mark.slow  # the real stages of one iteration with the tiny model (a minute on a loaded 2-core machine)
def test_curriculum_diagnostics_of_a_real_iteration_with_a_fixed_set(tiny_model: Path, tmp_path: Path) -> None:
    """design (the bundled pool) -> validate -> rollout beside a fixed set -> regret with --played ->
    report: the diagnostics cover the designs only, and hold together."""
    from spade_cli.core.layout import RunLayout

    lay = RunLayout(tmp_path / "run")
    lay.iter_dir(0).mkdir(parents=True)
    extra_designs, extras = tmp_path / "starter_designs.jsonl", tmp_path / "starter.jsonl"
    steps = [("design", "--pool", "bundled", "--n", "3", "--out", lay.designs(0)),
             ("validate", "--designs", lay.designs(0), "--out", lay.validated(0)),
             ("design", "--pool", "starter", "--n", "2", "--out", extra_designs),
             ("validate", "--designs", extra_designs, "--out", extras),
             ("rollout", "--model", tiny_model, "--envs", lay.validated(0), "--envs", extras, "--k", "2",
              "--max-turns", "1", "--max-tokens", "8", "--out", lay.rollouts(0)),
             ("regret", "--envs", lay.validated(0), "--played", extras, "--rollouts", lay.rollouts(0),
              "--out", lay.scores(0), "--embedding", "tfidf", "--no-seed-audit"),
             ("report", lay.root)]
    for step in steps:
        res = run_spade(*step, timeout=900)
        assert res.returncode == 0, (step[0], res.stderr[-3000:])
    (row,) = [json.loads(x) for x in (lay.report_dir / "iterations.jsonl").read_text().splitlines()]
    valid = [r for r in map(json.loads, lay.validated(0).read_text().splitlines()) if r["valid"]]
    played = {r["env_id"] for r in map(json.loads, lay.rollouts(0).read_text().splitlines())}
    assert len(played) > len(valid) >= 1  # the fixed set was played beside the designs ...
    assert row["scored_envs"] == 3  # ... and only the designs were scored
    shares = [row[f"share_{k}"] for k in ("too_easy", "learnable", "too_hard", "no_signal", "untested")]
    assert sum(shares) == pytest.approx(1.0) and all(s * len(valid) == pytest.approx(round(s * len(valid)))
                                                      for s in shares)
    qs = [row[f"regret_p{q}"] for q in (10, 25, 50, 75, 90)]
    assert qs == sorted(qs) and 0.0 <= row["share_ci_above_0"] <= 1.0
    assert "frontier" not in row  # the pool's envs carry no spec


@pytest.mark.integration
def test_designer_probe_columns_hold_hand_computed_values(spec_run: Path) -> None:
    """Checkpoints 0 and 3 on the fixed prompt set (recipes/designer_probe.sh's files): their
    figures land in the checkpoint's row, prefixed probe_, and row 3 exists through its probe alone."""
    from spade_cli.core.layout import RunLayout

    lay = RunLayout(spec_run)
    p0, p3 = lay.designer_probe(0), lay.designer_probe(3)
    # checkpoint 0: two valid designs of three (levels 1 and 3); e1 learnable with its interval above
    # 0 (regret 1.0 - 0.2), e2 no signal (regret 0.1 +- 0.3); the invalid one has no figures
    _jsonl(p0 / "validated.jsonl", [_spec_val(0, "e1", 1), _spec_val(0, "e2", 3), _spec_val(0, "e3", 2, False)])
    _jsonl(p0 / "scores.jsonl", [_scored("e1", 0.0, 1.0, 0.2), _scored("e2", 0.5, 0.6, 0.3),
                                 _scored("e3", None, None, None, valid=False)])
    # checkpoint 3: one valid design the Agent solves unhinted (too easy); validated but not yet
    # scored would leave no row 3, so both files are written
    _jsonl(p3 / "validated.jsonl", [_spec_val(0, "e9", 2)])
    _jsonl(p3 / "scores.jsonl", [_scored("e9", 0.9, 0.9, None)])
    proc = run_spade("report", spec_run, env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    rows = {r["iteration"]: r for r in map(json.loads, (spec_run / "report" / "iterations.jsonl").read_text().splitlines())}
    assert sorted(rows) == [0, 1, 2, 3]
    r0, r3 = rows[0], rows[3]
    assert r0["probe_valid_rate"] == pytest.approx(2 / 3) and r0["probe_level_mean"] == pytest.approx(2.0)
    assert r0["probe_regret_mean"] == pytest.approx(0.55) and r0["probe_share_learnable"] == pytest.approx(0.5)
    assert r0["probe_share_ci_above_0"] == pytest.approx(0.5)
    # the iteration's own figures are untouched by its probe's
    assert r0["valid_rate"] == pytest.approx(5 / 6) and r0["share_learnable"] == pytest.approx(0.4)
    assert r3["probe_valid_rate"] == 1.0 and r3["probe_regret_mean"] == pytest.approx(0.0)
    assert r3["probe_share_too_easy"] == 1.0 and "valid_rate" not in r3
    assert not any(k.startswith("probe_") for k in rows[1])
    data = (spec_run / "report" / "designer_probe.png").read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
