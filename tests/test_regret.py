"""Unit tests of the curriculum signals, the rollout fast path, memory merge and replay, with
expectations computed by hand (the arithmetic is written next to each number)."""

from __future__ import annotations

import json
import math

import pytest

from spade_cli.core.artifacts import InputError
from spade_cli.core.records import Validation
from spade_cli.designer import curriculum
from spade_cli.rollout import rollout_scan as scan
from stages import regret as stage

pytestmark = pytest.mark.unit


def test_paired_regret_and_ci_by_hand() -> None:
    # diffs 1.0, 0.0, 0.5: mean 0.5, sample sd 0.5, se 0.5/sqrt(3), t(0.975, 2) = 4.303
    s = curriculum.regret_stats({0: [1.0], 1: [0.5], 2: [1.0]}, {0: [0.0], 1: [0.5], 2: [0.5]})
    assert s["paired"] is True
    assert (s["hinted_n"], s["unhinted_n"]) == (3, 3)
    assert s["hinted_mean"] == pytest.approx(2.5 / 3) and s["unhinted_mean"] == pytest.approx(1 / 3)
    assert s["regret"] == pytest.approx(0.5)
    assert s["regret_ci95"] == pytest.approx(4.303 * 0.5 / math.sqrt(3))


def test_unpaired_fallback_by_hand() -> None:
    # pair 2 has no hinted episode: Welch se = sqrt(0.5/2 + 0/3) = 0.5, df = min(2, 3) - 1 = 1 -> t 12.706
    s = curriculum.regret_stats({0: [1.0], 1: [0.0]}, {0: [0.0], 1: [0.0], 2: [0.0]})
    assert s["paired"] is False
    assert s["regret"] == pytest.approx(0.5)
    assert s["regret_ci95"] == pytest.approx(12.706 * 0.5)


def test_regret_undefined_without_both_sides_and_ci_needs_two_pairs() -> None:
    s = curriculum.regret_stats({0: [1.0]}, {})
    assert s["regret"] is None and s["regret_ci95"] is None and s["unhinted_mean"] is None
    one = curriculum.regret_stats({0: [1.0]}, {0: [0.25]})
    assert one["regret"] == pytest.approx(0.75) and one["regret_ci95"] is None


def test_t_quantiles() -> None:
    assert curriculum.t975(7) == 2.365
    assert curriculum.t975(31) == pytest.approx(2.0395, abs=1e-3)
    assert curriculum.t975(10_000) == pytest.approx(1.960, abs=1e-3)


def test_learnability_and_success() -> None:
    p = curriculum.success_rate([1.0, 0.4, 0.5, 0.0], threshold=0.5)  # 1.0 and 0.5 reach it
    assert p == 0.5
    assert curriculum.learnability(0.25) == pytest.approx(0.1875)
    assert curriculum.designer_reward("learnability", {"unhinted_success": 0.5}) == pytest.approx(0.25)


def test_ema_lp_by_hand() -> None:
    # both EMAs start at the first observation: one observation, mastery and never-solved score 0
    assert curriculum.ema_lp([1.0]) == 0.0
    assert curriculum.ema_lp([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert curriculum.ema_lp([0.0, 0.0, 0.0, 0.0]) == 0.0
    # progress [0, 0, 1, 1]: from 0, fast 0.1 then 0.19, slow 0.01 then 0.028;
    # rw(0.19) = 0.171/0.252, rw(0.028) = 0.0252/0.1224
    assert curriculum.ema_lp([0.0, 0.0, 1.0, 1.0]) == pytest.approx(0.171 / 0.252 - 0.0252 / 0.1224)
    # forgetting is progress too (the absolute value): from 1, fast 0.9, slow 0.99
    assert curriculum.ema_lp([1.0, 0.0]) == pytest.approx(0.99 * 0.9 / (0.99 - 0.098) - 0.81 / (0.9 - 0.08))
    assert curriculum.designer_reward("ema_lp", {"success_history": []}) is None


def test_clip_negative() -> None:
    assert curriculum.designer_reward("regret", {"regret": -0.25}) == -0.25
    assert curriculum.designer_reward("regret", {"regret": -0.25}, clip_negative=True) == 0.0
    with pytest.raises(ValueError):
        curriculum.designer_reward("bogus", {})


def test_plr_priorities_by_hand() -> None:
    # ranks by score: idx2 1, idx0 2, idx1 3; beta 0.5 -> weights 1/4, 1/9, 1 (sum 49/36)
    # P_S = [9/49, 4/49, 36/49]; P_C = [1/4, 3/4, 0]; P = (P_S + P_C) / 2
    p = curriculum.replay_priorities([0.5, 0.0, 1.0], [1, 3, 0], beta=0.5, rho=0.5)
    assert p == pytest.approx([(9 / 49 + 0.25) / 2, (4 / 49 + 0.75) / 2, (36 / 49) / 2])
    assert sum(p) == pytest.approx(1.0)
    assert curriculum.replay_priorities([0.2, 0.1], [0, 0], beta=1.0, rho=0.5) == pytest.approx([2 / 3, 1 / 3])


def test_cut_tokens_keeps_every_other_field() -> None:
    row = {"schema": "spade.rollout/1", "env_id": "a", "hinted": True, "pair": 3, "return": 0.5,
           "tokens": {"prompt_ids": [1, 2], "completion_ids": [3], "env_mask": [1], "logprobs": [None, -0.5]},
           "messages": [{"role": "user", "content": 'a "tokens": {"x": "}"} trap'}], "error": None}
    for text in (json.dumps(row), json.dumps(row, separators=(",", ":"))):
        raw = text.encode()
        cut = json.loads(scan._cut_tokens(raw))
        assert cut["tokens"] is None
        assert {k: v for k, v in cut.items() if k != "tokens"} == {k: v for k, v in row.items() if k != "tokens"}
    # a tokens object holding strings is not cut (the parser reads it whole)
    odd = json.dumps({**row, "tokens": {"note": "}{"}}).encode()
    assert scan._cut_tokens(odd) == odd


def test_episode_rejects_bad_fields(tmp_path) -> None:
    good = {"schema": "spade.rollout/1", "episode_id": "e", "env_id": "a", "iteration": 0, "hinted": False,
            "seed": 1, "pair": 0, "return": 1.0, "error": None}
    assert scan._episode(tmp_path, 1, json.dumps(good).encode()) == ("e", "a", False, 0, 1.0, None)
    for bad, why in [({"return": "1"}, "field 'return' must be a number"),
                     ({"hinted": 1}, "field 'hinted' must be true or false"),
                     ({"pair": 1.5}, "field 'pair' must be an integer"),
                     ({"schema": "spade.score/1"}, "expected a spade.rollout"),
                     ({"schema": "spade.rollout/9"}, "newer than this spade"),
                     ({"return": 7.5}, r"field 'return' must lie in \[0, 1\]"),
                     ({"return": -2.0, "error": "crashed"}, r"must lie in \[-1, 1\]"),
                     ({"env_id": ""}, "field 'env_id' must be a non-empty string")]:
        with pytest.raises(InputError, match=why) as exc:
            scan._episode(tmp_path / "r.jsonl", 7, json.dumps({**good, **bad}).encode())
        assert str(exc.value).startswith(f"{tmp_path / 'r.jsonl'}:7:")
    with pytest.raises(InputError, match="lacks required field"):
        scan._episode(tmp_path, 2, json.dumps({k: v for k, v in good.items() if k != "return"}).encode())


def _stats(regret: float, success: float) -> dict:
    return {"unhinted_mean": 0.1, "hinted_mean": 0.1 + regret, "regret": regret, "regret_ci95": None,
            "hinted_n": 2, "unhinted_n": 2, "unhinted_success": success}


def test_memory_merge_is_idempotent_and_keeps_code() -> None:
    env = Validation(code="class E: pass", hint="h", title="T", doc={"id": "d1"}, valid=True, iteration=1)
    played = {env.env_id: _stats(0.5, 0.0)}
    once = stage.merge_memory([], 1, played, {env.env_id: env})
    twice = stage.merge_memory(once, 1, played, {env.env_id: env})
    assert once == twice
    (row,) = twice
    assert (row["env_id"], row["doc_id"], row["first_iteration"], row["code"]) == (env.env_id, "d1", 1, env.code)
    assert [h["iteration"] for h in row["history"]] == [1]
    # the next iteration appends; a rerun of iteration 1 with new numbers replaces, not appends
    later = stage.merge_memory(twice, 2, {env.env_id: _stats(0.25, 0.5)}, {})
    redo = stage.merge_memory(later, 1, {env.env_id: _stats(0.75, 0.0)}, {env.env_id: env})
    assert [(h["iteration"], h["regret"]) for h in redo[0]["history"]] == [(1, 0.75), (2, 0.25)]


def test_replay_ranking() -> None:
    def mem(env_id: str, regret: float, last: int) -> dict:
        return {"env_id": env_id, "title": env_id, "hint": "h", "doc_id": None, "first_iteration": 0,
                "code": f"# {env_id}", "history": [{"iteration": last, "regret": regret}]}

    memory = [mem("a", 0.1, 5), mem("b", 0.9, 5), mem("c", -0.5, 1), mem("d", 0.6, 5), mem("x", 2.0, 5)]
    # rho 0: pure rank prioritisation on positive regret; 'x' is excluded (invalid this iteration)
    picked = curriculum.select_replay(memory, 5, 2, {"x"}, beta=0.1, rho=0.0)
    assert [r["env_id"] for r in picked] == ["b", "d"]
    assert all(r["schema"] == "spade.validation/1" and r["valid"] and r["iteration"] == 6 for r in picked)
    assert picked[0]["code"] == "# b"
    # rho 1: pure staleness; 'c' was last played at iteration 1 (staleness 5 vs 1)
    assert curriculum.select_replay(memory, 5, 1, {"x"}, beta=0.1, rho=1.0)[0]["env_id"] == "c"
    # envs without code are never replayed
    assert curriculum.select_replay([{**memory[1], "code": None}], 5, 3, set(), 0.1, 0.1) == []


def test_a_spec_design_keeps_its_spec_in_memory_and_replay() -> None:
    spec = {"rule": "reverse", "level": 3}
    env = Validation(code="class E: pass", hint="h", title="T", valid=True, iteration=1, extra={"spec": spec})
    plain = Validation(code="class F: pass", hint="h", title="F", valid=True, iteration=1)
    merged = stage.merge_memory([], 1, {e.env_id: _stats(0.5, 0.0) for e in (env, plain)},
                                {e.env_id: e for e in (env, plain)})
    assert [r.get("spec") for r in merged] == [spec, None]
    picked = {r["env_id"]: r for r in curriculum.select_replay(merged, 1, 2, set(), 0.1, 0.1)}
    assert picked[env.env_id]["spec"] == spec and "spec" not in picked[plain.env_id]
    assert [curriculum.level_of(r) for r in (picked[env.env_id], picked[plain.env_id], {"spec": {"level": True}})] \
        == [3, None, None]


def test_cells_pool_episodes_by_spec_fields_and_keep_pairs_apart() -> None:
    a = {"spec": {"rule": "twice", "level": 2, "rounds": 3}}
    b = {"spec": {"rule": "twice", "level": 2, "rounds": 5}}
    assert curriculum.cell_key(a, ["rule", "level"]) == curriculum.cell_key(b, ["rule", "level"])
    assert curriculum.cell_key(a, ["rule", "rounds"]) != curriculum.cell_key(b, ["rule", "rounds"])
    assert curriculum.cell_key({"spec": None}, ["rule"]) is None  # a free-form design has no cell
    assert curriculum.cell_key(a, ["rule", "feedback"]) is None
    # both envs use pair 0: pooled, they are two pairs, not one pair with two episodes per side
    per_env = {"a": {"h": {0: [1.0]}, "u": {0: [0.0]}, "h_err": 0, "u_err": 1},
               "b": {"h": {0: [0.5]}, "u": {0: [0.5]}, "h_err": 0, "u_err": 0}}
    got = curriculum.cell_stats({"a": ("x",), "b": ("x",)}, per_env, 0.5)
    assert got["a"] is got["b"] and got["a"]["cell_envs"] == 2
    assert (got["a"]["regret"], got["a"]["paired"], got["a"]["hinted_n"]) == (0.5, True, 2)
    assert got["a"]["regret_ci95"] == pytest.approx(12.706 * math.sqrt(0.5) / math.sqrt(2))  # sd of (1, 0)
    assert got["a"]["unhinted_errors"] == 1


@pytest.mark.parametrize("fast", [True, False], ids=["msgspec-if-installed", "json"])
def test_scan_rollouts_both_parsers_agree(tmp_path, monkeypatch, fast: bool) -> None:
    from spade_cli.core.artifacts import fingerprint

    if not fast:
        monkeypatch.setattr(scan, "_fast_decoder", lambda: None)
    rows = [{"schema": "spade.rollout/1", "episode_id": f"e{p}{h}", "env_id": "a", "hinted": h, "pair": p,
             "return": r, "error": e, "tokens": {"prompt_ids": [1, 2, 3], "logprobs": [None, -0.5]}}
            for h, p, r, e in [(True, 0, 1, None), (False, 0, 0.25, "step_timeout"), (True, 1, 0.5, None)]]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    envs, fps = scan.scan_rollouts([path], {"a"}, chunk=7)  # tiny chunks: lines cross block edges
    assert fps == [{k: v for k, v in fingerprint(path).items()}]
    st = envs["a"]
    # the failed episode recorded 0.25 but scores 0 (the failure rule)
    assert dict(st["h"]) == {0: [1.0], 1: [0.5]} and dict(st["u"]) == {0: [0.0]}
    assert (st["h_err"], st["u_err"]) == (0, 1)
    path.write_text(json.dumps(rows[0]) + "\n" + json.dumps({**rows[1], "pair": True}) + "\n")
    with pytest.raises(InputError, match=r"r.jsonl:2: field 'pair' must be an integer"):
        scan.scan_rollouts([path], {"a"})


def test_rows_written_by_the_rollout_record_take_the_fast_path(tmp_path) -> None:
    from spade_cli.core.artifacts import dumps
    from spade_cli.core.records import Rollout

    rec = Rollout(episode_id="e", env_id="a", iteration=0, hinted=True, seed=5, pair=2, return_=0.75,
                  messages=[{"role": "user", "content": 'say "}" please'}],
                  turns=[{"action": "}", "observation": "{", "reward": 0.75}],
                  tokens={"prompt_ids": [1] * 50, "completion_ids": [2] * 50, "env_mask": [1, 0] * 25,
                          "logprobs": [-0.1, None] * 25})
    raw = dumps(rec).encode()
    cut = scan._cut_tokens(raw)
    assert len(cut) < len(raw) / 2 and json.loads(cut)["tokens"] is None
    path = tmp_path / "r.jsonl"
    path.write_bytes(raw + b"\n")
    envs, _ = scan.scan_rollouts([path], {"a"})
    assert dict(envs["a"]["h"]) == {2: [0.75]}


def test_a_repeated_episode_is_counted_once_or_refused(tmp_path) -> None:
    row = {"schema": "spade.rollout/1", "episode_id": "e0", "env_id": "a", "hinted": True, "pair": 0,
           "return": 1.0, "error": None}
    other = {**row, "episode_id": "e1", "hinted": False, "return": 0.0}
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, other, row)))
    warnings: list[str] = []
    envs, _ = scan.scan_rollouts([path], {"a"}, warnings=warnings)
    assert dict(envs["a"]["h"]) == {0: [1.0]}  # not [1.0, 1.0]: the copy weighs nothing
    assert warnings == [f"1 duplicated episode row(s), identical to an earlier one, counted once "
                        f"({path}:3 repeats {path}:1)"]
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, other, {**row, "return": 0.5})))
    with pytest.raises(InputError, match=rf"r.jsonl:3: episode 'e0' is also at {path}:1 with other values"):
        scan.scan_rollouts([path], {"a"})
