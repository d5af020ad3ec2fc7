"""`spade compare` over hand-made run directories whose table is computed by hand below.

Three arms: ``spade`` (2 seeds), ``hand_curated`` (3 seeds) and ``frozen`` (1 seed, half the episodes).
Every run has two iterations (rollouts with token ids, scores with Vendi/n) and evals of the
starting model (iteration 0) and of the final checkpoint (iteration 2).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import run_spade

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T975 = {1: 12.706204736, 2: 4.302652730}  # t-quantiles for 1 and 2 degrees of freedom


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _ep(i: int, env: str, hinted: bool, pair: int, agent_tokens: int) -> dict:
    mask = [1] * agent_tokens + [0] * 3  # 3 env tokens that are not the Agent's
    return {"schema": "spade.rollout/1", "episode_id": f"{i}-{env}-{int(hinted)}-{pair}", "env_id": env,
            "iteration": i, "hinted": hinted, "seed": pair, "pair": pair, "return": 0.5,
            "tokens": {"prompt_ids": [1], "completion_ids": [2] * len(mask), "env_mask": mask}}


def make_run(root: Path, final: float, *, envs: int = 2, tokens: int = 10, vendi: float = 0.5,
             start: float = 0.1) -> Path:
    """Two iterations of ``envs`` envs x 2 pairs x 2 sides, ``tokens`` Agent tokens per episode."""
    for i in range(2):
        it = root / f"iter_{i:04d}"
        _jsonl(it / "rollouts.jsonl", [_ep(i, f"e{e}", h, p, tokens) for e in range(envs)
                                       for h in (False, True) for p in range(2)])
        _jsonl(it / "scores.jsonl", [])
        (it / "scores.jsonl.manifest.json").write_text(json.dumps({"summary": {"vendi_per_n": vendi + i / 10}}))
    for i, v in ((0, start), (2, final)):
        _jsonl(root / "eval" / f"iter_{i:04d}.jsonl",
               [{"schema": "spade.eval/1", "task": "lm:tiny", "metric": "acc", "value": v, "stderr": 0, "n": 4}])
    return root


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    exp = tmp_path / "exp"
    for s, v in enumerate([0.2, 0.4]):
        make_run(exp / "spade" / f"seed_{s}", v)
    for s, v in enumerate([0.5, 0.6, 0.7]):
        make_run(exp / "hand_curated" / f"seed_{s}", v, tokens=11 + s)
    make_run(exp / "frozen" / "seed_0", 0.9, envs=1)
    return exp


def _rows(path: Path) -> dict:
    with open(path, newline="") as fh:
        return {(r["row"], r["arm"]): r for r in csv.DictReader(fh)}


@pytest.mark.unit
def test_compare_table_holds_hand_computed_means_intervals_and_budget_marks(experiment: Path) -> None:
    from stages import compare

    res = compare.run([experiment], experiment / "compare", plots=False)
    assert set(res["arms"]) == {"spade", "hand_curated", "frozen"} and res["reference"] == "spade"
    rows = _rows(experiment / "compare" / "compare.csv")
    acc = rows[("lm:tiny/acc", "spade")]
    assert (acc["n"], acc["iteration"], acc["values"]) == ("2", "2", "0.200;0.400")
    assert float(acc["mean"]) == pytest.approx(0.3)
    assert float(acc["ci95"]) == pytest.approx(T975[1] * 0.1414213562 / 2 ** 0.5, rel=1e-6)
    assert float(acc["start"]) == pytest.approx(0.1)
    curated = rows[("lm:tiny/acc", "hand_curated")]
    assert float(curated["mean"]) == pytest.approx(0.6)
    assert float(curated["ci95"]) == pytest.approx(T975[2] * 0.1 / 3 ** 0.5, rel=1e-6)
    frozen = rows[("lm:tiny/acc", "frozen")]
    assert (frozen["n"], frozen["ci95"]) == ("1", "")  # one seed: no interval
    # Vendi/n is the mean over a run's iterations (0.5 and 0.6); every seed agrees, so the CI is 0
    assert float(rows[("Vendi / n", "spade")]["mean"]) == pytest.approx(0.55)
    # budgets: 2 envs x 2 pairs x 2 sides = 8 episodes an iteration; frozen plays 1 env = 4
    ep = "Agent episodes / iteration"
    assert float(rows[(ep, "spade")]["mean"]) == 8 and float(rows[(ep, "frozen")]["mean"]) == 4
    tok = "Agent tokens / iteration"
    assert float(rows[(tok, "spade")]["mean"]) == 80  # env tokens (the mask's 0s) are not counted
    assert float(rows[(tok, "hand_curated")]["mean"]) == pytest.approx(8 * 12)  # 88, 96, 104
    # hand_curated's tokens differ by 20% > 5%; frozen's episodes by 50%
    assert set(res["budget_differs"]) == {"hand_curated", "frozen"}
    assert rows[(ep, "frozen")]["budget_differs"] == "True" and rows[(ep, "spade")]["budget_differs"] == "False"
    md = (experiment / "compare" / "compare.md").read_text()
    assert "| lm:tiny/acc | 2 | 0.100 | 0.300 ± 1.271 | 0.900 (n=1, no CI) | 0.600 ± 0.248 |" in md
    assert "| benchmark | iteration | start (iter 0) | spade | frozen† | hand_curated† |" in md
    assert "frozen: budget differs from spade's" in md and "| seeds | | | 2 | 1 | 3 |" in md
    loose = compare.run([experiment], experiment / "loose", plots=False, budget_tol=0.5)
    assert loose["budget_differs"] == {}  # 50% is within a tolerance of 50%


@pytest.mark.unit
def test_compare_uses_the_latest_iteration_every_run_has(experiment: Path, tmp_path: Path) -> None:
    from stages import compare

    ahead = experiment / "spade" / "seed_0"  # one run is further on: its iteration 4 is not compared
    _jsonl(ahead / "eval" / "iter_0004.jsonl",
           [{"schema": "spade.eval/1", "task": "lm:tiny", "metric": "acc", "value": 1.0, "n": 4}])
    res = compare.run([experiment / "spade", experiment / "frozen"], tmp_path / "out", plots=False)
    by = {(r["row"], r["arm"]): r for r in res["table"]}
    assert by[("lm:tiny/acc", "spade")]["mean"] == pytest.approx(0.3)
    assert res["notes"] == ["lm:tiny/acc: frozen vs spade: seeds without a partner left out of the paired row: seed_1"]
    forced = compare.run([experiment / "spade"], tmp_path / "forced", iteration=4, plots=False)
    row = next(r for r in forced["table"] if r["row"] == "lm:tiny/acc")
    assert (row["n"], row["mean"]) == (1, 1.0) and "left out" in forced["notes"][0]


@pytest.mark.unit
def test_paired_rows_difference_each_seed_against_the_reference(experiment: Path, tmp_path: Path) -> None:
    from stages import compare

    res = compare.run([experiment], tmp_path / "out", plots=False)
    label = "lm:tiny/acc: Δ vs spade (paired by seed)"
    rows = _rows(tmp_path / "out" / "compare.csv")
    # hand_curated - spade on seed_0 and seed_1 (0.5 - 0.2, 0.6 - 0.4); its seed_2 has no partner
    curated = rows[(label, "hand_curated")]
    assert (curated["kind"], curated["n"], curated["values"], curated["seeds"]) == ("paired", "2", "0.300;0.200",
                                                                                   "seed_0;seed_1")
    assert float(curated["mean"]) == pytest.approx(0.25)
    # sd of (0.3, 0.2) is 0.0707: the interval is the t(1) one of the differences, not of the columns
    assert float(curated["ci95"]) == pytest.approx(T975[1] * 0.0707106781 / 2 ** 0.5, rel=1e-6)
    assert any("hand_curated vs spade: seeds without a partner" in n and "seed_2" in n for n in res["notes"])
    frozen = rows[(label, "frozen")]
    assert (frozen["n"], frozen["values"], frozen["ci95"]) == ("1", "0.700", "")
    assert (rows[(label, "spade")]["n"], rows[(label, "spade")]["mean"]) == ("0", "")  # the reference itself
    md = (tmp_path / "out" / "compare.md").read_text()
    assert f"| {label} | 2 |  | - | 0.700 (n=1, no CI) | 0.250 ± 0.635 |" in md
    # with settings, runs pair by their SEED, whatever their folders are called
    for arm, seeds in (("spade", {"seed_0": "7", "seed_1": "8"}), ("hand_curated", {"seed_0": "8", "seed_1": "7",
                                                                                    "seed_2": "9"})):
        for name, seed in seeds.items():
            (experiment / arm / name / "settings.json").write_text(json.dumps({"SEED": seed}))
    res = compare.run([experiment / "spade", experiment / "hand_curated"], tmp_path / "by-seed", plots=False)
    row = next(r for r in res["table"] if r["row"] == label and r["arm"] == "hand_curated")
    assert row["seeds"] == ["SEED=8", "SEED=7"] and row["values"] == pytest.approx([0.5 - 0.4, 0.6 - 0.2])
    # two runs of one seed in an arm cannot be paired: an empty cell and a note, the table still written
    (experiment / "hand_curated" / "seed_2" / "settings.json").write_text(json.dumps({"SEED": "7"}))
    res = compare.run([experiment / "spade", experiment / "hand_curated"], tmp_path / "twice", plots=False)
    row = next(r for r in res["table"] if r["row"] == label and r["arm"] == "hand_curated")
    assert row["n"] == 0 and any("hand_curated: two of its runs have the same seed" in n for n in res["notes"])


@pytest.mark.integration
def test_spade_compare_writes_table_and_curves_and_names_bad_input(experiment: Path, tmp_path: Path) -> None:
    proc = run_spade("compare", experiment)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [Path(p).name for p in summary["plots"]] == ["curve-lm_tiny_acc.png"]
    data = Path(summary["plots"][0]).read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000
    assert "hand_curated†" in proc.stderr and "budget differs" in proc.stderr
    # runs given one by one are arms of one seed each
    proc = run_spade("compare", experiment / "spade" / "seed_0", experiment / "frozen" / "seed_0",
                     "--out", tmp_path / "pair", "--reference", "seed_0")
    assert proc.returncode == 1 and "two runs named seed_0" in proc.stderr
    empty = tmp_path / "empty"
    (empty / "nothing").mkdir(parents=True)
    proc = run_spade("compare", empty)
    assert proc.returncode == 1 and "no run directories" in proc.stderr
    proc = run_spade("compare", experiment, tmp_path)
    assert proc.returncode == 2 and "--out" in proc.stderr


@pytest.mark.integration
def test_unequal_budgets_and_settings_are_loud_and_strict_refuses(experiment: Path, tmp_path: Path) -> None:
    from spade_cli.core.artifacts import SpadeError
    from stages import compare

    shared = {"MODEL": "m", "CORPUS": "c", "DESIGN_ARGS": "--thinking", "N_ENVS": "2", "K": "2", "SEED": "0",
              "POOL": "", "SIGNAL": "regret"}
    for arm in ("spade", "hand_curated"):
        for run in sorted((experiment / arm).iterdir()):
            seed = run.name.removeprefix("seed_")
            pool = "bundled" if arm == "hand_curated" else ""
            (run / "settings.json").write_text(json.dumps({**shared, "SEED": seed, "POOL": pool}))
    pair = [experiment / "spade", experiment / "hand_curated"]
    res = compare.run(pair, tmp_path / "same", plots=False, budget_tol=0.5)
    # the seed and the arm's knob differ by design; nothing else does
    assert res["settings_checked"] and res["settings_differ"] == {} and res["budget_differs"] == {}
    assert compare.run(pair, tmp_path / "strict-ok", plots=False, budget_tol=0.5, strict=True)["status"] == "ok"
    # a baseline built without the main arm's corpus and thinking settings
    odd = experiment / "hand_curated" / "seed_1" / "settings.json"
    odd.write_text(json.dumps({**json.loads(odd.read_text()), "CORPUS": "", "DESIGN_ARGS": ""}))
    res = compare.run(pair, tmp_path / "odd", plots=False)
    why = res["settings_differ"]["hand_curated"]
    assert "seed_1: CORPUS '' vs 'c'" in why and "DESIGN_ARGS" in why and "spade" not in res["settings_differ"]
    md = (tmp_path / "odd" / "compare.md").read_text()
    assert md.startswith("**UNEQUAL BUDGETS: † hand_curated against spade") and "**SETTINGS DIFFER: hand_curated" in md
    with pytest.raises(SpadeError, match="not a controlled comparison") as err:
        compare.run(pair, tmp_path / "strict", plots=False, strict=True)
    assert "hand_curated: budget differs" in str(err.value) and "CORPUS" in str(err.value)
    assert not (tmp_path / "strict").exists()  # a refusal writes nothing
    # a run without the file, beside runs with it, is named
    (experiment / "spade" / "seed_0" / "settings.json").unlink()
    assert "seed_0: no settings.json" in compare.run(pair, tmp_path / "gap", plots=False)["settings_differ"]["spade"]
    proc = run_spade("compare", *pair, "--out", tmp_path / "cli", "--strict")
    assert proc.returncode == 1 and "not a controlled comparison" in proc.stderr
