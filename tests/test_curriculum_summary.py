"""recipes/curriculum/summarize.py's interval for the one-seed steering pilot, by hand."""

from __future__ import annotations

import importlib.util
import json

from tests.conftest import REPO


def _summarize():
    spec = importlib.util.spec_from_file_location("summarize", REPO / "recipes" / "curriculum" / "summarize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_welch_difference_of_design_means_with_the_conservative_t():
    welch = _summarize().welch
    # means 0.3 and 0.2; variances 0.02 and 0.04; se = sqrt(0.02/2 + 0.04/3) = 0.15275; t(1) = 12.706
    assert welch([0.2, 0.4], [0.0, 0.2, 0.4]) == "+0.100 ± 1.941 (designs 2, 3)"
    # means 0.25 and 0.58; se = sqrt(0.016667/4 + 0.007/5) = 0.07461; df = min(n) - 1 = 3, t = 3.1824
    a, b = [0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 0.6, 0.6, 0.7]
    assert welch(a, b) == "-0.330 ± 0.237 (designs 4, 5)"
    assert welch([0.5], b) == "n/a" and welch(a, []) == "n/a"  # no variance from one design


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_reward_fit_correlates_paid_reward_with_the_probe_overall_and_within_groups(tmp_path):
    table = {("twice", 1): {"gain": 0.4}, ("first", 2): {"gain": 0.0}, ("last", 1): {"gain": 0.2}}
    it = tmp_path / "iter_0000"
    it.mkdir()
    specs = {"a": ("twice", 1), "b": ("first", 2), "c": ("last", 1), "d": ("twice", 1), "e": ("last", 1),
             "f": ("first", 2)}
    _rows(it / "validated.jsonl", [{"schema": "spade.validation/1", "env_id": e, "valid": e != "e",
                                    "spec": {"rule": r, "level": lv}} for e, (r, lv) in specs.items()])
    score = {"schema": "spade.score/1", "iteration": 0, "signal": "regret", "hinted_mean": 0.0,
             "unhinted_mean": 0.0, "hinted_n": 4, "unhinted_n": 4, "regret": 0.0, "regret_ci95": 0.3}
    paid = {"a": ("g0", 0.5), "b": ("g0", 0.1), "c": ("g1", 0.3), "d": ("g1", 0.1), "e": ("g1", 0.9),
            "f": ("g0", 0.9)}
    _rows(it / "scores.jsonl", [{**score, "env_id": e, "group_id": g, "designer_reward": x,
                                 "note": "replay" if e == "f" else None} for e, (g, x) in paid.items()])
    fit = _summarize().reward_fit([it / "validated.jsonl"], table)
    # e is invalid, f a replay: paid 0.5, 0.1, 0.3, 0.1 against true 0.4, 0.0, 0.2, 0.4
    # overall: cov 0.05 / sqrt(0.11 * 0.11) = 0.4545; within groups: dx ±0.2, ±0.1, dy ±0.2, ∓0.1 -> 0.06 / 0.1
    assert fit["designs"] == 4
    assert round(fit["r"], 4) == 0.4545 and round(fit["r_within"], 4) == 0.6
    assert _summarize().correlation([0.1, 0.1], [0.2, 0.3]) is None  # a constant reward has no correlation
