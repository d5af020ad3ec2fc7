"""`spade update --agent-credit turn`: each reply is credited with its own reward-to-go.

Unit tests compute the advantages by hand for a group of three two-turn episodes; the integration
test runs a real update of the tiny model on episodes that each won one turn and lost the other:
every return is the same, so episode credit has no signal and leaves the model as it was, while
turn credit raises the winning reply against the losing one inside each episode.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_update import _logps


def _row(i: int, rewards: list[float], *, env: str = "envA", error: str | None = None, ends: bool = True,
         hinted: bool = False) -> dict:
    """An episode of len(rewards) replies: 2 agent tokens, then 1 env token, per reply."""
    completion, mask = [], []
    for t in range(len(rewards)):
        completion += [10 + t, 20 + t, 5]
        mask += [1, 1, 0]
    tokens = {"prompt_ids": [1, 2, 3], "completion_ids": completion, "env_mask": mask, "logprobs": None}
    if ends:
        tokens["reply_ends"] = [3 * t + 2 for t in range(len(rewards))]
    return {"schema": "spade.rollout/1", "episode_id": f"{env}-{int(hinted)}-{i}", "env_id": env, "iteration": 0,
            "hinted": hinted, "seed": i, "pair": i, "messages": [],
            "turns": [{"action": "a", "observation": "o", "reward": r} for r in rewards],
            "return": sum(rewards), "terminated": True, "truncated": False, "error": error, "tokens": tokens}


def _collect(tmp_path: Path, rows: list[dict], **kw: object):
    from spade_cli.training.samples import collect_samples
    from stages.update import UpdateConfig

    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = UpdateConfig(model="unused", rollouts=[str(path)], out=str(tmp_path / "out"), **kw)
    return collect_samples(cfg)


def _per_turn(sample) -> list[float | None]:
    """The advantage of each reply's tokens (None: left out of the loss)."""
    out = []
    for t in range(len(sample.completion_ids) // 3):
        m, a = sample.mask[3 * t:3 * t + 2], sample.token_advantages[3 * t:3 * t + 2]
        assert m[0] == m[1] and a[0] == a[1] and sample.mask[3 * t + 2] == 0
        out.append(round(a[0], 2) if m[0] else None)  # 2 places: the std guard (1e-4) moves the 4th
    return out


# Three episodes of one group: won turn 0 only, turn 1 only, both; nobody won turn 2.
REWARDS = [[0.25, 0.0, 0.0], [0.0, 0.25, 0.0], [0.25, 0.25, 0.0]]
HI, LO = 0.58, -1.15  # a group (x, x, y) standardised: the x at +-1/sqrt(3), y at -+2/sqrt(3)


def test_turn_credit_gamma_zero_by_hand(tmp_path: Path) -> None:
    samples, counts = _collect(tmp_path, [_row(i, r) for i, r in enumerate(REWARDS)],
                               agent_credit="turn", turn_gamma=0.0)
    assert len(samples) == 3 and {s.group for s in samples} == {("agent", "envA", False)}
    per = [_per_turn(s) for s in samples]  # file order: won turn 0, won turn 1, won both
    assert per[0] == [HI, LO, None]
    assert per[1] == [LO, HI, None]
    assert per[2][:2] == [HI, HI] and per[2][2] is None
    assert counts["agent"]["turn_positions"] == 3 and counts["agent"]["zero_spread_turn_positions"] == 1


def test_turn_credit_gamma_one_is_reward_to_go(tmp_path: Path) -> None:
    samples, _ = _collect(tmp_path, [_row(i, r) for i, r in enumerate(REWARDS)], agent_credit="turn")
    per = [_per_turn(s) for s in samples]  # file order
    # turn 0's reward-to-go is the return (0.25, 0.25, 0.5); turn 1's is (0, 0.25, 0.25)
    assert per[0] == [-HI, LO, None]
    assert per[1] == [-HI, HI, None]
    assert per[2] == [-LO, HI, None]


def test_episode_credit_is_unchanged(tmp_path: Path) -> None:
    """The default gives every token its episode's advantage, as before: the episode that won
    turn 0 is pushed down on that turn too."""
    samples, counts = _collect(tmp_path, [_row(i, r) for i, r in enumerate(REWARDS)])
    assert [s.token_advantages for s in samples] == [None] * 3
    assert [round(s.advantage, 2) for s in samples] == [-HI, -HI, -LO]
    assert [s.mask for s in samples] == [[1, 1, 0] * 3] * 3
    assert "turn_positions" not in counts["agent"]


def test_a_failed_episode_earns_nothing_on_any_turn(tmp_path: Path) -> None:
    rows = [_row(0, [0.25, 0.0]), _row(1, [0.0, 0.0]), _row(2, [0.25, 0.25], error="step_timeout")]
    samples, _ = _collect(tmp_path, rows, agent_credit="turn", turn_gamma=0.0)
    # turn 0 earned (0.25, 0, 0) once the failure counts as 0; turn 1 (0, 0, 0) has no spread
    assert [_per_turn(s) for s in samples] == [[-LO, None],
                                               [-HI, None],
                                               [-HI, None]]
    assert samples[2].reward == 0.0


def test_dropped_reasoning_trains_each_turn_with_its_own_advantage(tmp_path: Path) -> None:
    """think_context drop: one sequence per turn, located by the turn spans (rows from before
    reply_ends have them too), each carrying its own turn's advantage."""
    rows = []
    for i, r in enumerate(REWARDS):
        row = _row(i, r, ends=i != 0)  # the first row locates its replies by its turn spans only
        row["tokens"].update(think_context="drop", turns=[
            {"prefix": 3 if t else 0, "ids": [] if t else [1, 2, 3], "start": 3 * t, "end": 3 * t + 2}
            for t in range(3)])
        rows.append(row)
    samples, _ = _collect(tmp_path, rows, agent_credit="turn", turn_gamma=0.0)
    # turn 2 has no spread: its sequences have no trained token left and are not samples
    assert len(samples) == 6 and all(len(s.completion_ids) == 2 for s in samples)
    got = [round(s.token_advantages[0], 2) for s in samples]
    assert got == [HI, LO, LO, HI, HI, HI]
    assert all(s.token_advantages[0] == s.token_advantages[1] and s.mask == [1, 1] for s in samples)


def test_rows_without_reply_ends_are_refused_with_their_line(tmp_path: Path) -> None:
    from spade_cli.core.artifacts import InputError

    rows = [_row(0, [0.25]), _row(1, [0.0], ends=False)]
    with pytest.raises(InputError, match=r"rollouts.jsonl:2: .*reply_ends"):
        _collect(tmp_path, rows, agent_credit="turn")
    _collect(tmp_path, rows)  # episode credit never needed them
    bad = _row(1, [0.0, 0.25])
    bad["tokens"]["reply_ends"] = [5, 2]
    with pytest.raises(InputError, match=r"rollouts.jsonl:2: .*non-decreasing"):
        _collect(tmp_path, [rows[0], bad], agent_credit="turn")
    odd = _row(1, [0.0, 0.25])
    odd["turns"][1]["reward"] = "0.25"
    with pytest.raises(InputError, match=r"rollouts.jsonl:2: turns\[1\].reward must be a finite number"):
        _collect(tmp_path, [rows[0], odd], agent_credit="turn")
    short = _row(1, [0.0, 0.25])
    short["tokens"]["reply_ends"] = [2]  # the second reply's tokens belong to no reply
    with pytest.raises(InputError, match=r"rollouts.jsonl:2: .*cover every agent token"):
        _collect(tmp_path, [rows[0], short], agent_credit="turn")


def test_turn_gamma_out_of_range_is_a_usage_error(tiny_model: Path, tmp_path: Path) -> None:
    from tests.conftest import run_spade

    (tmp_path / "r.jsonl").write_text(json.dumps(_row(0, [0.25])) + "\n")
    for flags in (["--turn-gamma", "1.5"], ["--agent-credit", "step"]):
        res = run_spade("update", "--model", str(tiny_model), "--rollouts", str(tmp_path / "r.jsonl"),
                        "--out", str(tmp_path / "ck"), *flags)
        assert res.returncode == 2, res.stderr
    assert not (tmp_path / "ck").exists()


GOOD, BAD = "open the door now", "sit and wait"
ENV_TEXT = "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n"


def _two_turn_rollouts(root: Path, model_dir: Path) -> Path:
    """Episodes of two replies, one GOOD (0.5) and one BAD (0), in both orders twice, as the engine
    records them (reply_ends, sampler log-probs of the tiny model itself)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spade_cli.backends import render_chat

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = []
    prompt = render_chat(tok, [{"role": "user", "content": "Play."}])
    for i, pair in enumerate([(True, False), (False, True)] * 2):
        completion, mask, ends, turns = [], [], [], []
        for good in pair:
            act = enc(GOOD if good else BAD)
            completion += act
            mask += [1] * len(act)
            ends.append(len(completion))
            env = enc(ENV_TEXT)
            completion += env
            mask += [0] * len(env)
            turns.append({"action": GOOD if good else BAD, "observation": "next", "reward": 0.5 if good else 0.0})
        lps = _logps(model, prompt, completion)
        rows.append({"schema": "spade.rollout/1", "episode_id": f"e{i}", "env_id": "env", "iteration": 0,
                     "hinted": False, "seed": i, "pair": i, "messages": [], "turns": turns,
                     "return": sum(t["reward"] for t in turns), "terminated": True, "truncated": False,
                     "error": None, "tokens": {"prompt_ids": prompt, "completion_ids": completion,
                                               "env_mask": mask, "reply_ends": ends,
                                               "logprobs": [lp if m else None for lp, m in zip(lps, mask, strict=True)]}})
    path = root / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _reply_logps(model_dir: Path, row: dict) -> list[float]:
    from transformers import AutoModelForCausalLM

    t = row["tokens"]
    lps = _logps(AutoModelForCausalLM.from_pretrained(model_dir), t["prompt_ids"], t["completion_ids"])
    out, start = [], 0
    for end in t["reply_ends"]:
        out.append(sum(lp for lp, m in zip(lps[start:end], t["env_mask"][start:end], strict=True) if m))
        start = end
    return out


@pytest.mark.integration
def test_a_real_update_credits_each_reply(tiny_model: Path, tmp_path: Path) -> None:
    from stages import update

    path = _two_turn_rollouts(tmp_path, tiny_model)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 4 and {r["return"] for r in rows} == {0.5}
    before = {r["episode_id"]: _reply_logps(tiny_model, r) for r in rows}
    moved = {}
    for credit in ("episode", "turn"):
        out = tmp_path / credit
        update.run(update.UpdateConfig(model=str(tiny_model), rollouts=[str(path)], out=str(out), agent_credit=credit,
                                       turn_gamma=0.0, learning_rate=1e-3, per_device_train_batch_size=4,
                                       max_grad_norm=0.0, num_iterations=2))
        # how far the GOOD reply of an episode rose against its BAD reply
        gaps = []
        for r in rows:
            after = _reply_logps(out, r)
            good = [t for t, turn in enumerate(r["turns"]) if turn["reward"] > 0][0]
            delta = [a - b for a, b in zip(after, before[r["episode_id"]], strict=True)]
            gaps.append(delta[good] - delta[1 - good])
        moved[credit] = sum(gaps) / len(gaps)
    # the new knobs enter the manifest's config only away from their defaults, so updates written
    # before they existed stay "up to date"
    configs = {c: json.loads((tmp_path / f"{c}.manifest.json").read_text())["config"] for c in moved}
    assert "agent_credit" not in configs["episode"] and configs["episode"]["turn_gamma"] == 0.0
    assert configs["turn"]["agent_credit"] == "turn"
    # episode credit: one return for all, no spread, the model passed through unchanged
    assert moved["episode"] == 0.0
    assert json.loads((tmp_path / "episode" / "update.json").read_text())["counts"]["agent"]["zero_spread_groups"] == 1
    # turn credit pushes the winning reply up and the losing one down inside each episode
    assert moved["turn"] > 0.5, moved
